#!/usr/bin/env python3
"""Every test docs/behaviour.md cites as `crate/(src|tests)/file.rs::name` exists.

The contract names the tests that prove each rule; a renamed or removed test must not leave a
rule citing nothing. Exits 1 naming each missing test.
"""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
doc = open(os.path.join(root, "docs", "behaviour.md"), encoding="utf-8").read()
cited = set(re.findall(r"`([a-z0-9_-]+/(?:src|tests)/[A-Za-z0-9_/.-]+\.rs)::([a-z0-9_]+)`", doc))
missing = []
for path, name in sorted(cited):
    file = os.path.join(root, "crates", path)
    if not os.path.exists(file) or not re.search(r"\bfn\s+" + name + r"\b", open(file, encoding="utf-8").read()):
        missing.append(f"{path}::{name}")
print(f"docs/behaviour.md: {len(cited)} tests cited, {len(missing)} missing")
for m in missing:
    print(f"  missing: {m}")
sys.exit(1 if missing else 0)
