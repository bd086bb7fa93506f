//! Property tests of the probe kubeconfig reader (`kube_client::check_inline_only` and
//! `PreparedShootConfig::prepare`, what every probe run goes through): a shoot's kubeconfig is
//! written by a tenant, so whatever it holds must never panic or hang the reader, never read a
//! file of ours or run a command, and never put its secrets into an error message.
//!
//! - **The corpus** (`tests/corpus/kubeconfig/`, always replayed): each file says on its first
//!   line what must happen (`# expect: ok`, `# expect: refused <field>`, `# expect: invalid`).
//!   Placeholders are filled in per run: `{{CA}}`, `{{CERT}}`, `{{KEY}}` (fresh test
//!   certificates, so no key is committed), `{{TOKEN_FILE}}` (a file holding a planted token),
//!   `{{MARKER}}` (a file an `exec` command would create).
//! - **Properties**, for a time budget (`DWD_PROPTEST_MILLIS`, default 1000 ms each) from a
//!   printed seed (`DWD_PROPTEST_SEED` replays it): generated kubeconfigs with and without
//!   forbidden fields are accepted or refused naming a forbidden field they hold; mutated ones
//!   never panic, hang or leak.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use dependency_watchdog::client::kube_client::{PreparedShootConfig, check_inline_only};
use futures::FutureExt;
use kube::config::Kubeconfig;

/// Every secret a test kubeconfig carries contains this.
const PLANTED: &str = "PLANTED";

// --- the generator and the runner: dwd-core's, shared with its tests/properties.rs ----------

#[path = "../../dwd-core/tests/support/property.rs"]
mod property;

use property::{Cases, Rng};

// --- test material --------------------------------------------------------------------------

/// Fresh certificates and the files the placeholders name.
struct Material {
    ca_b64: String,
    cert_b64: String,
    key_b64: String,
    token_file: PathBuf,
    marker: PathBuf,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A directory of this test process, removed on drop.
    pub(crate) struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub(crate) fn new(name: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("dwd-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Material {
    fn new(name: &str) -> Material {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let pki = dwd_testenv::pki::Pki::generate().expect("pki");
        let client = pki.issue_client("tenant", &[]).expect("client certificate");
        let dir = tempdir::Dir::new(name);
        let token_file = dir.0.join("seed-token");
        std::fs::write(&token_file, format!("{PLANTED}-SEED-TOKEN-FROM-A-FILE")).expect("token");
        Material {
            ca_b64: b64(&pki.ca_pem()),
            cert_b64: b64(&client.cert_pem),
            key_b64: b64(&client.key_pem),
            token_file,
            marker: dir.0.join("exec-ran"),
            _dir: dir,
        }
    }

    fn fill(&self, text: &str) -> String {
        text.replace("{{CA}}", &self.ca_b64)
            .replace("{{CERT}}", &self.cert_b64)
            .replace("{{KEY}}", &self.key_b64)
            .replace("{{TOKEN_FILE}}", &self.token_file.display().to_string())
            .replace("{{MARKER}}", &self.marker.display().to_string())
    }

    /// What an error message must never contain.
    fn leaks(&self, message: &str) -> Option<&'static str> {
        if message.contains(PLANTED) {
            Some("a planted secret")
        } else if message.contains("-----BEGIN") {
            Some("PEM material")
        } else if message.contains(&self.key_b64[..40]) {
            Some("the client key")
        } else {
            None
        }
    }
}

/// `prepare` as a probe run calls it; a panic or a hang (> 5 s) is a failure naming the input.
async fn prepare(text: &str) -> Result<Result<(), String>, String> {
    let t = Instant::now();
    let fut =
        AssertUnwindSafe(PreparedShootConfig::prepare(text, Duration::from_secs(5))).catch_unwind();
    let outcome = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| format!("prepare hung on:\n{text}"))?
        .map_err(|_| format!("prepare panicked on:\n{text}"))?;
    if t.elapsed() > Duration::from_secs(5) {
        return Err(format!("prepare took {:?} on:\n{text}", t.elapsed()));
    }
    Ok(outcome.map(|_| ()).map_err(|e| e.to_string()))
}

// --- the corpus -------------------------------------------------------------------------------

fn corpus() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/kubeconfig");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).expect("corpus file"))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 10, "kubeconfig corpus too small");
    files
}

#[tokio::test]
async fn corpus_kubeconfigs_are_accepted_or_refused_naming_the_field() {
    let m = Material::new("kubeconfig-corpus");
    let mut wrong = Vec::new();
    for (name, raw) in corpus() {
        let expect = raw
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{name}: first line must be `# expect: …`"))
            .trim()
            .to_string();
        let text = m.fill(&raw);
        let outcome = match prepare(&text).await {
            Ok(o) => o,
            Err(failure) => {
                wrong.push(format!("{name}: {failure}"));
                continue;
            }
        };
        if let Err(e) = &outcome
            && let Some(what) = m.leaks(e)
        {
            wrong.push(format!("{name}: the error shows {what}: {e}"));
        }
        match (
            expect.split_whitespace().collect::<Vec<_>>().as_slice(),
            &outcome,
        ) {
            (["ok"], Ok(())) | (["invalid"], Err(_)) => {}
            (["refused", field], Err(e)) => {
                let named = if *field == "server" {
                    e.contains("server must be an https:// URL")
                } else {
                    e.contains(&format!("field {field} "))
                };
                if !named {
                    wrong.push(format!("{name}: refused without naming field {field}: {e}"));
                }
                // check_inline_only alone says the same.
                if let Ok(kc) = Kubeconfig::from_yaml(&text)
                    && check_inline_only(&kc).is_ok()
                {
                    wrong.push(format!("{name}: check_inline_only accepts it"));
                }
            }
            (want, got) => wrong.push(format!("{name}: want {want:?}, got {got:?}")),
        }
    }
    assert!(
        !m.marker.exists(),
        "an exec command ran: {} exists",
        m.marker.display()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// --- generated kubeconfigs ------------------------------------------------------------------

/// A forbidden field: its key, how check_inline_only names it, YAML lines to add.
struct Forbidden {
    named: &'static str,
    lines: fn(&Material) -> String,
}

const CLUSTER_FORBIDDEN: [Forbidden; 3] = [
    Forbidden {
        named: "certificate-authority",
        lines: |_| "    certificate-authority: /dev/zero\n".into(),
    },
    Forbidden {
        named: "proxy-url",
        lines: |_| format!("    proxy-url: http://{PLANTED}U:{PLANTED}P@127.0.0.1:9\n"),
    },
    Forbidden {
        named: "insecure-skip-tls-verify",
        lines: |_| "    insecure-skip-tls-verify: true\n".into(),
    },
];

const USER_FORBIDDEN: [Forbidden; 11] = [
    Forbidden {
        named: "tokenFile",
        lines: |m| format!("    tokenFile: {}\n", m.token_file.display()),
    },
    Forbidden {
        named: "client-certificate",
        lines: |_| "    client-certificate: /etc/hostname\n".into(),
    },
    Forbidden {
        named: "client-key",
        lines: |_| "    client-key: /etc/hostname\n".into(),
    },
    Forbidden {
        named: "exec",
        lines: |m| {
            format!(
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"touch {}\"]\n      env: [{{name: S, value: {PLANTED}-ENV}}]\n",
                m.marker.display()
            )
        },
    },
    Forbidden {
        named: "auth-provider",
        lines: |_| {
            format!(
                "    auth-provider:\n      name: oidc\n      config: {{secret: {PLANTED}-OIDC}}\n"
            )
        },
    },
    Forbidden {
        named: "username",
        lines: |_| "    username: admin\n".into(),
    },
    Forbidden {
        named: "password",
        lines: |_| format!("    password: {PLANTED}-PASSWORD\n"),
    },
    Forbidden {
        named: "as",
        lines: |_| "    as: system:admin\n".into(),
    },
    Forbidden {
        named: "as-uid",
        lines: |_| "    as-uid: \"0\"\n".into(),
    },
    Forbidden {
        named: "as-groups",
        lines: |_| "    as-groups: [system:masters]\n".into(),
    },
    Forbidden {
        named: "as-user-extra",
        lines: |_| format!("    as-user-extra:\n      scopes: [{PLANTED}-EXTRA]\n"),
    },
];

/// A kubeconfig of 1–2 clusters and users, the first of each the current context's; each
/// entry sometimes carries forbidden fields. Returns the text and the fields it carries.
fn generate(rng: &mut Rng, m: &Material) -> (String, Vec<&'static str>) {
    let mut forbidden = Vec::new();
    let mut text = String::from(
        "apiVersion: v1\nkind: Config\ncurrent-context: shoot\ncontexts:\n- name: shoot\n  context: {cluster: c0, user: u0}\nclusters:\n",
    );
    for c in 0..1 + rng.below(2) {
        text.push_str(&format!("- name: c{c}\n  cluster:\n"));
        let server = *rng.pick(&[
            "https://127.0.0.1:6443",
            "https://kube-apiserver",
            "https://[::1]:443",
            "https://api.shoot.example:443/prefix",
            "http://127.0.0.1:6443",
        ]);
        if server.starts_with("http://") {
            forbidden.push("server");
        }
        text.push_str(&format!("    server: {server}\n"));
        text.push_str(&format!("    certificate-authority-data: {}\n", m.ca_b64));
        if rng.chance(30) {
            text.push_str("    tls-server-name: kube-apiserver\n");
        }
        let insecure_false = rng.chance(10);
        if insecure_false {
            text.push_str("    insecure-skip-tls-verify: false\n");
        }
        for f in &CLUSTER_FORBIDDEN {
            // Each key once: `insecure-skip-tls-verify: true` only without `false`.
            if rng.chance(8) && !(insecure_false && f.named == "insecure-skip-tls-verify") {
                text.push_str(&(f.lines)(m));
                forbidden.push(f.named);
            }
        }
    }
    text.push_str("users:\n");
    for u in 0..1 + rng.below(2) {
        text.push_str(&format!("- name: u{u}\n  user:\n"));
        if rng.chance(50) {
            text.push_str(&format!(
                "    token: {PLANTED}-TOKEN-{}\n",
                rng.below(1 << 20)
            ));
        } else {
            text.push_str(&format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                m.cert_b64, m.key_b64
            ));
        }
        for f in &USER_FORBIDDEN {
            if rng.chance(5) {
                text.push_str(&(f.lines)(m));
                forbidden.push(f.named);
            }
        }
    }
    (text, forbidden)
}

/// Runs `check` on generated cases for the time budget (at least 50 cases).
async fn property<F, Fut>(name: &str, mut check: F)
where
    F: FnMut(Rng) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut cases = Cases::new(name, 50);
    while let Some(case_seed) = cases.next_seed() {
        if let Err(failure) = check(Rng(case_seed)).await {
            cases.failed(case_seed, &failure);
        }
    }
}

#[tokio::test]
async fn property_generated_kubeconfigs_are_refused_exactly_when_they_hold_a_forbidden_field() {
    let m = Material::new("kubeconfig-generated");
    property("generated_kubeconfigs", |mut rng| {
        let (text, forbidden) = generate(&mut rng, &m);
        let m = &m;
        async move {
            let outcome = prepare(&text).await?;
            let inline = Kubeconfig::from_yaml(&text)
                .map_err(|e| format!("unparsable generated kubeconfig: {e}\n{text}"))
                .map(|kc| check_inline_only(&kc).map_err(|e| e.to_string()))?;
            match (&outcome, forbidden.is_empty()) {
                (Ok(()), true) if inline.is_ok() => Ok(()),
                (Err(e), false) => {
                    if let Some(what) = m.leaks(e) {
                        return Err(format!("the error shows {what}: {e}\n{text}"));
                    }
                    let named = forbidden.iter().any(|f| {
                        if *f == "server" {
                            e.contains("server must be an https:// URL")
                        } else {
                            e.contains(&format!("field {f} "))
                        }
                    });
                    if named && inline.is_err() {
                        Ok(())
                    } else {
                        Err(format!(
                            "refused without naming any of {forbidden:?} (check_inline_only: {inline:?}): {e}\n{text}"
                        ))
                    }
                }
                _ => Err(format!(
                    "forbidden fields {forbidden:?}, prepare {outcome:?}, check_inline_only {inline:?}\n{text}"
                )),
            }
        }
    })
    .await;
    assert!(!m.marker.exists(), "an exec command ran");
}

/// One random edit of a kubeconfig text.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let (mut lines, i) = property::lines_to_edit(rng, text);
    let choice = rng.below(7);
    if property::move_line(rng, &mut lines, i, choice) {
        return lines.join("\n");
    }
    match choice {
        3 => {
            if let Some((key, _)) = lines[i].split_once(": ") {
                // Secrets are planted only where secrets go: names and references (entry
                // names, current-context) are quoted in errors on purpose.
                let secret_key = matches!(
                    key.trim_start_matches([' ', '-']),
                    "server" | "token" | "password" | "proxy-url" | "client-key-data"
                );
                let plain: &[&str] = &[
                    "~", "[]", "{}", "true", "0", "\"\"", "-1", "[1, 2]", "{a: b}", "http://x",
                    "https://", "&a x", "*a",
                ];
                let planted: &[&str] = &["https://user:PLANTED@h", "!!binary PLANTED", "PLANTED"];
                let value = if secret_key && rng.chance(30) {
                    *rng.pick(planted)
                } else {
                    *rng.pick(plain)
                };
                lines[i] = format!("{key}: {value}");
            }
        }
        4 => {
            let l = &mut lines[i];
            if l.len() > 2 {
                // Cut a value (base64 or PEM data) short.
                let at = (1..l.len())
                    .filter(|&k| l.is_char_boundary(k))
                    .nth(rng.below(l.len() as u64 - 1) as usize)
                    .unwrap_or(1);
                l.truncate(at);
            }
        }
        5 => {
            let chars = [
                ':', '-', '[', ']', '{', '}', '#', '&', '*', '|', '"', '\t', ',',
            ];
            property::insert_char(rng, &mut lines[i], &chars);
        }
        _ => {
            lines[i] = format!("  {}", lines[i]);
        }
    }
    lines.join("\n")
}

#[tokio::test]
async fn property_mutated_kubeconfigs_never_panic_hang_or_leak() {
    let m = Material::new("kubeconfig-mutated");
    let seeds: Vec<String> = corpus().into_iter().map(|(_, t)| m.fill(&t)).collect();
    property("mutated_kubeconfigs", |mut rng| {
        let mut text = rng.pick(&seeds).clone();
        for _ in 0..=rng.below(4) {
            text = mutate(&mut rng, &text);
        }
        let m = &m;
        async move {
            match prepare(&text).await? {
                Ok(()) => Ok(()),
                Err(e) => match m.leaks(&e) {
                    Some(what) => Err(format!("the error shows {what}: {e}\n{text}")),
                    None => Ok(()),
                },
            }
        }
    })
    .await;
    assert!(!m.marker.exists(), "an exec command ran");
}
