//! The drawn structure of the library stays true: no module cycles, and the module graph in
//! docs/architecture.md is the one the code has.
//!
//! The source is parsed with `syn` (not grepped): the module tree is walked from `lib.rs`
//! through its `mod` declarations, skipping modules and items under `#[cfg(test)]`, and every
//! path through `crate::` or `super::` is an edge. Two granularities:
//! - top-level modules (`events`, `metrics`, `prober`, …): an edge `a → b` when code in `a` or
//!   below names something in `b`;
//! - siblings inside one parent (`prober::controller → prober::manager`): the parent module
//!   itself is the namespace its children share (its context types, its re-exports), so edges
//!   between a parent and its own children are not cycles.
//!
//! Both graphs must be acyclic. The top-level graph is printed and compared with the fenced
//! `module-graph` block of docs/architecture.md, so the drawing cannot drift from the code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::visit::Visit;

/// A module: its path below the crate (`[]` is the crate root, `["prober", "probe"]`).
type ModPath = Vec<String>;

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(list) if list.path.is_ident("cfg") => list
            .tokens
            .to_string()
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|w| w == "test"),
        _ => false,
    })
}

/// The `Visit` methods that pass over what is compiled for tests only (`#[cfg(test)]`
/// modules, functions, impls and methods): the rules here are about production code.
macro_rules! pass_over_cfg_test {
    () => {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !is_cfg_test(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }

        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if !is_cfg_test(&f.attrs) {
                syn::visit::visit_item_fn(self, f);
            }
        }

        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            if !is_cfg_test(&i.attrs) {
                syn::visit::visit_item_impl(self, i);
            }
        }

        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            if !is_cfg_test(&f.attrs) {
                syn::visit::visit_impl_item_fn(self, f);
            }
        }
    };
}

/// Every module of the library (not under `cfg(test)`), with its parsed file.
fn modules(src: &Path) -> BTreeMap<ModPath, syn::File> {
    let mut out = BTreeMap::new();
    walk(src, &src.join("lib.rs"), Vec::new(), &mut out);
    out
}

fn walk(src: &Path, file: &Path, path: ModPath, out: &mut BTreeMap<ModPath, syn::File>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    // Where this module's children live: `src/` for the root, `src/a/` for `a.rs`/`a/mod.rs`.
    let dir: PathBuf = path.iter().fold(src.to_path_buf(), |d, p| d.join(p));
    for item in &parsed.items {
        let syn::Item::Mod(m) = item else { continue };
        if is_cfg_test(&m.attrs) || m.content.is_some() {
            continue;
        }
        let name = m.ident.to_string();
        let child = [
            dir.join(format!("{name}.rs")),
            dir.join(&name).join("mod.rs"),
        ]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("module {name} declared in {} has no file", file.display()));
        let mut child_path = path.clone();
        child_path.push(name);
        walk(src, &child, child_path, out);
    }
    out.insert(path, parsed);
}

/// Collects the `crate::`/`super::` paths a module names, resolved to module paths.
struct Refs<'a> {
    module: &'a [String],
    known: &'a BTreeSet<ModPath>,
    found: BTreeSet<ModPath>,
}

impl Refs<'_> {
    /// The longest known module that `segments` (absolute, below the crate) starts with.
    fn note(&mut self, segments: &[String]) {
        let mut best: Option<ModPath> = None;
        for n in 1..=segments.len() {
            let prefix = segments[..n].to_vec();
            if self.known.contains(&prefix) {
                best = Some(prefix);
            }
        }
        if let Some(m) = best {
            self.found.insert(m);
        }
    }

    /// `segments` as written, made absolute when it starts with `crate` or `super`.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        if first == "crate" {
            return Some(segments[1..].to_vec());
        }
        if first == "super" {
            let mut base = self.module.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            return Some(base);
        }
        None
    }

    fn use_tree(&mut self, prefix: Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                let mut next = prefix;
                next.push(p.ident.to_string());
                self.use_tree(next, &p.tree);
            }
            syn::UseTree::Name(n) => self.use_leaf(prefix, n.ident.to_string()),
            syn::UseTree::Rename(r) => self.use_leaf(prefix, r.ident.to_string()),
            syn::UseTree::Glob(_) => self.use_leaf(prefix, String::new()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix.clone(), t);
                }
            }
        }
    }

    fn use_leaf(&mut self, mut prefix: Vec<String>, leaf: String) {
        if !leaf.is_empty() && leaf != "self" {
            prefix.push(leaf);
        }
        if let Some(abs) = self.absolute(&prefix) {
            self.note(&abs);
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    pass_over_cfg_test!();

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_cfg_test(&u.attrs) {
            self.use_tree(Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(abs) = self.absolute(&segments) {
            self.note(&abs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// Edges between top-level modules, and between siblings below one parent.
fn graphs(
    src: &Path,
) -> (
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<ModPath, BTreeSet<ModPath>>,
) {
    let files = modules(src);
    let known: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut siblings: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (module, file) in &files {
        let Some(own_top) = module.first() else {
            continue;
        };
        top.entry(own_top.clone()).or_default();
        let mut refs = Refs {
            module,
            known: &known,
            found: BTreeSet::new(),
        };
        refs.visit_file(file);
        for target in refs.found {
            let Some(target_top) = target.first() else {
                continue;
            };
            if target_top != own_top {
                top.entry(own_top.clone())
                    .or_default()
                    .insert(target_top.clone());
                continue;
            }
            // Inside one top-level module: an edge between two different children of the
            // same parent (the parent itself and its own children excepted).
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common < module.len() && common < target.len() {
                let from = module[..=common].to_vec();
                let to = target[..=common].to_vec();
                if from != to {
                    siblings.entry(from).or_default().insert(to);
                }
            }
        }
    }
    (top, siblings)
}

fn cycle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn dfs<N: Ord + Clone>(
        n: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        state: &mut BTreeMap<N, u8>,
        stack: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for d in graph.get(n).into_iter().flatten() {
            match state.get(d) {
                Some(1) => {
                    let at = stack.iter().position(|s| s == d).unwrap_or(0);
                    let mut c = stack[at..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = dfs(d, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if !state.contains_key(n)
            && let Some(c) = dfs(n, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level graph as the doc draws it: `module → dependency, dependency` per line, in
/// dependency order (a module after everything it uses).
fn drawn(top: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut placed: Vec<String> = Vec::new();
    while placed.len() < top.len() {
        let before = placed.len();
        for (m, deps) in top {
            if !placed.contains(m) && deps.iter().all(|d| placed.contains(d)) {
                placed.push(m.clone());
            }
        }
        if placed.len() == before {
            break; // a cycle: the other test names it
        }
    }
    placed
        .iter()
        .map(|m| {
            let deps: Vec<&str> = top[m].iter().map(String::as_str).collect();
            if deps.is_empty() {
                format!("{m}\n")
            } else {
                format!("{m} → {}\n", deps.join(", "))
            }
        })
        .collect()
}

/// Every module path the code of `from` (and its children) names outside itself.
fn names_used_by(from: &str) -> BTreeSet<ModPath> {
    let files = modules(&src());
    let known: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut used = BTreeSet::new();
    for (module, file) in files
        .iter()
        .filter(|(m, _)| m.first().is_some_and(|t| t == from))
    {
        let mut refs = Refs {
            module,
            known: &known,
            found: BTreeSet::new(),
        };
        refs.visit_file(file);
        used.extend(
            refs.found
                .into_iter()
                .filter(|t| t.first().is_some_and(|t| t != from)),
        );
    }
    used
}

#[test]
fn explain_reads_the_prober_only_through_its_view() {
    let into_prober: Vec<String> = names_used_by("explain")
        .into_iter()
        .filter(|m| m.first().is_some_and(|t| t == "prober"))
        .map(|m| m.join("::"))
        .collect();
    assert!(
        !into_prober.is_empty(),
        "explain no longer uses the prober at all?"
    );
    assert!(
        into_prober.iter().all(|m| m == "prober::view"),
        "explain reaches into {into_prober:?}; give prober::view what it needs instead"
    );
}

#[test]
fn the_prober_and_the_weeder_do_not_import_each_other() {
    for (a, b) in [("prober", "weeder"), ("weeder", "prober")] {
        let crossing: Vec<String> = names_used_by(a)
            .into_iter()
            .filter(|m| m.first().is_some_and(|t| t == b))
            .map(|m| m.join("::"))
            .collect();
        assert!(
            crossing.is_empty(),
            "{a} uses {crossing:?}: move what both need below them"
        );
    }
}

#[test]
fn the_library_has_no_module_cycles() {
    let (top, siblings) = graphs(&src());
    assert!(top.len() > 10, "walked only {:?}", top.keys());
    if let Some(c) = cycle(&top) {
        panic!("module cycle between top-level modules: {}", c.join(" → "));
    }
    if let Some(c) = cycle(&siblings) {
        let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
        panic!(
            "module cycle between sibling modules: {}",
            names.join(" → ")
        );
    }
}

#[test]
fn docs_architecture_draws_the_module_graph_the_code_has() {
    let (top, _) = graphs(&src());
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let block = doc
        .split("```text module-graph\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("{} has no ```text module-graph block", doc_path.display()));
    let want = drawn(&top);
    assert_eq!(
        block, want,
        "docs/architecture.md's module graph is not the code's; the code's is:\n{want}"
    );
}

/// docs/architecture.md's module table (its "## Every module" section) has one row per module
/// of the library, named by its path (`prober::probe`), and no row for a module that is gone.
#[test]
fn docs_architecture_has_a_row_for_every_module() {
    let code: BTreeSet<String> = modules(&src())
        .into_keys()
        .filter(|path| !path.is_empty())
        .map(|path| path.join("::"))
        .collect();
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let section = doc
        .split("\n## Every module\n")
        .nth(1)
        .map(|rest| rest.split("\n## ").next().unwrap_or(rest))
        .unwrap_or_else(|| panic!("{} has no \"## Every module\" section", doc_path.display()));
    let rows: BTreeSet<String> = section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = code.difference(&rows).collect();
    let gone: Vec<&String> = rows.difference(&code).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/architecture.md's module table: rows missing for {missing:?}, rows for modules \
         that do not exist {gone:?}"
    );
}

/// The modules a probe run goes through, in order: each may use the ones after it, never one
/// before it.
const RUN_PATH: [&str; 3] = ["probe", "executor", "scaler"];

#[test]
fn the_run_path_goes_one_way() {
    let (_, siblings) = graphs(&src());
    let module = |name: &str| vec!["prober".to_owned(), name.to_owned()];
    for pair in RUN_PATH.windows(2) {
        let uses = siblings.get(&module(pair[0])).cloned().unwrap_or_default();
        assert!(
            uses.contains(&module(pair[1])),
            "prober::{} no longer uses prober::{}: update RUN_PATH and docs/architecture.md",
            pair[0],
            pair[1]
        );
    }
    for (i, later) in RUN_PATH.iter().enumerate() {
        let uses = siblings.get(&module(later)).cloned().unwrap_or_default();
        for earlier in &RUN_PATH[..i] {
            assert!(
                !uses.contains(&module(earlier)),
                "prober::{later} uses prober::{earlier}, which calls it: the run path must go one way"
            );
        }
    }
}

/// The longest a function on the run path may be, in lines: one a newcomer reads at once.
const LONGEST_FUNCTION: usize = 80;

/// The functions of `file` outside `#[cfg(test)]` modules: (name, first line, lines).
fn function_lengths(file: &syn::File) -> Vec<(String, usize, usize)> {
    struct Lengths(Vec<(String, usize, usize)>);
    impl Lengths {
        fn note(&mut self, name: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
            let first = sig.fn_token.span.start().line;
            let last = block.brace_token.span.close().end().line;
            self.0.push((name.to_string(), first, last + 1 - first));
        }
    }
    impl<'ast> Visit<'ast> for Lengths {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !is_cfg_test(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.note(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.note(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    let mut lengths = Lengths(Vec::new());
    lengths.visit_file(file);
    lengths.0
}

#[test]
fn no_function_on_the_run_path_is_longer_than_eighty_lines() {
    let files = modules(&src());
    let mut long = Vec::new();
    for name in RUN_PATH {
        let path = vec!["prober".to_owned(), name.to_owned()];
        let file = files
            .get(&path)
            .unwrap_or_else(|| panic!("no module prober::{name}"));
        let lengths = function_lengths(file);
        assert!(!lengths.is_empty(), "no function found in prober::{name}");
        for (function, line, lines) in lengths {
            if lines > LONGEST_FUNCTION {
                long.push(format!(
                    "prober::{name}::{function} (line {line}): {lines} lines"
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "longer than {LONGEST_FUNCTION} lines: {long:?}"
    );
}

/// The identifiers of `file` outside what is compiled for tests only.
fn identifiers(file: &syn::File) -> BTreeSet<String> {
    struct Idents(BTreeSet<String>);
    impl<'ast> Visit<'ast> for Idents {
        pass_over_cfg_test!();
        fn visit_field(&mut self, f: &'ast syn::Field) {
            if !is_cfg_test(&f.attrs) {
                syn::visit::visit_field(self, f);
            }
        }
        fn visit_ident(&mut self, i: &'ast proc_macro2::Ident) {
            self.0.insert(i.to_string());
        }
    }
    let mut idents = Idents(BTreeSet::new());
    idents.visit_file(file);
    idents.0
}

/// Shadow mode is an executor that records instead of writing, chosen once at startup
/// (`prober::executor::Executors`): the probe and the scaler never ask which mode they run in,
/// and neither do the weeder's loops (its hands are chosen once, in `weeder::run`).
#[test]
fn nothing_on_the_run_path_asks_whether_it_is_in_shadow_mode() {
    let files = modules(&src());
    let loops = [
        ("prober", "probe"),
        ("prober", "scaler"),
        ("prober", "report"),
        ("weeder", "pods"),
        ("weeder", "slices"),
        ("weeder", "registry"),
        ("weeder", "claims"),
    ];
    for (parent, name) in loops {
        let path = vec![parent.to_owned(), name.to_owned()];
        let file = files
            .get(&path)
            .unwrap_or_else(|| panic!("no module {parent}::{name}"));
        let asking: Vec<String> = identifiers(file)
            .into_iter()
            .filter(|i| i.to_lowercase().contains("shadow"))
            .collect();
        assert!(
            asking.is_empty(),
            "{parent}::{name} names {asking:?}: shadow mode belongs to its executor (or, in \
             the weeder, to its hands)"
        );
    }
}

/// The probe talks to its shoot's executor only through methods every mode has: each method
/// of `impl Executor` hands the call to both the acting and the recording executor, and the
/// probe calls no other method on it (an acting-only or recording-only method on the run path
/// would be a mode branch by another name).
#[test]
fn the_probe_names_no_executor_method_that_exists_for_one_mode_only() {
    let files = modules(&src());
    let executor = &files[&vec!["prober".to_owned(), "executor".to_owned()]];
    let mut both_modes = BTreeSet::new();
    for item in &executor.items {
        let syn::Item::Impl(imp) = item else { continue };
        let syn::Type::Path(ty) = &*imp.self_ty else {
            continue;
        };
        if imp.trait_.is_some() || !ty.path.is_ident("Executor") {
            continue;
        }
        for f in &imp.items {
            let syn::ImplItem::Fn(f) = f else { continue };
            let body = f.block.to_token_stream().to_string();
            let name = f.sig.ident.to_string();
            assert!(
                body.contains("Executor :: Acting") && body.contains("Executor :: Recording"),
                "Executor::{name} does not hand the call to both executors: {body}"
            );
            both_modes.insert(name);
        }
    }
    let probe = &files[&vec!["prober".to_owned(), "probe".to_owned()]];
    struct Calls(BTreeSet<String>);
    impl<'ast> Visit<'ast> for Calls {
        pass_over_cfg_test!();
        fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
            if call.receiver.to_token_stream().to_string() == "executor" {
                self.0.insert(call.method.to_string());
            }
            syn::visit::visit_expr_method_call(self, call);
        }
    }
    let mut calls = Calls(BTreeSet::new());
    calls.visit_file(probe);
    assert!(!calls.0.is_empty(), "the probe calls no executor method");
    let one_mode: Vec<&String> = calls.0.difference(&both_modes).collect();
    assert!(
        one_mode.is_empty(),
        "the probe calls {one_mode:?} on its executor, which are not methods of every mode \
         (Executor's: {both_modes:?})"
    );
}

/// The workspace's crates of ours and, per crate, `(dependencies, dev-only dependencies)` of
/// ours, read from each `crates/*/Cargo.toml`.
fn crate_graph() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut manifests: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let dir = entry.expect("crates/ entry").path();
        let manifest = dir.join("Cargo.toml");
        if let Ok(text) = std::fs::read_to_string(&manifest) {
            let name = dir
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            manifests.insert(name, text);
        }
    }
    let ours: BTreeSet<String> = manifests.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (name, text) in &manifests {
        let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_owned();
                continue;
            }
            let key = line.split(['.', ' ', '=']).next().unwrap_or_default();
            if !ours.contains(key) {
                continue;
            }
            match section.as_str() {
                "[dependencies]" => normal.insert(key.to_owned()),
                "[dev-dependencies]" => dev.insert(key.to_owned()),
                _ => false,
            };
        }
        let dev: BTreeSet<String> = dev.difference(&normal).cloned().collect();
        graph.insert(name.clone(), (normal, dev));
    }
    graph
}

#[test]
fn docs_architecture_draws_the_crate_graph_the_manifests_have() {
    let list = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(", ");
    let want: BTreeSet<String> = crate_graph()
        .into_iter()
        .map(|(name, (normal, dev))| {
            let mut line = match normal.is_empty() {
                true => format!("{name} → (nothing of ours)"),
                false => format!("{name} → {}", list(&normal)),
            };
            if !dev.is_empty() {
                line.push_str(&format!("; tests → {}", list(&dev)));
            }
            line
        })
        .collect();
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let drawn: BTreeSet<String> = doc
        .split("```text crate-graph\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("{} has no ```text crate-graph block", doc_path.display()))
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        drawn,
        want,
        "docs/architecture.md's crate graph is not the manifests'; theirs is:\n{}",
        want.iter().cloned().collect::<Vec<_>>().join("\n")
    );
}
