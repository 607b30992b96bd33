//! Boundaries the compiler does not check, checked here (ARCHITECTURE.md, "Layers"):
//!
//! - the protocol core (`fragment`, `delta`, `proto`, `peer`, `sim`) is pure: no tokio, libp2p,
//!   atoll-net, file system, sockets, threads or wall clock;
//! - atoll-net knows nothing of training: no burn;
//! - the run dir's formats (`rundir`) sit below the node and the status page, and the page
//!   below the node: no `crate::node` or `crate::web` in `rundir`, no `crate::node` in `web`;
//! - the library returns typed errors and never prints: no anyhow, no `print!`-family
//!   macros outside the command line (`src/main.rs`, `src/cmd/`).
//!
//! Each rule scans the source text for the paths it forbids (comments left out). The
//! `rules_catch_what_they_forbid` test shows each rule failing on a line it must refuse.

use std::path::{Path, PathBuf};

/// A layer: the files it covers, and what they must not name.
struct Rule {
    name: &'static str,
    roots: &'static [&'static str],
    /// Files under `roots` the rule does not cover.
    except: &'static [&'static str],
    forbidden: &'static [&'static str],
}

const CORE: Rule = Rule {
    name: "protocol core",
    roots: &[
        "src/fragment.rs",
        "src/delta.rs",
        "src/delta",
        "src/proto.rs",
        "src/proto",
        "src/peer.rs",
        "src/peer",
        "src/sim.rs",
        "src/sim",
    ],
    except: &[],
    forbidden: &[
        "tokio",
        "libp2p",
        "atoll_net",
        "std::fs",
        "std::net",
        "std::thread",
        "SystemTime",
        "Instant",
        "std::process",
    ],
};

const NET: Rule =
    Rule { name: "atoll-net", roots: &["net/src"], except: &[], forbidden: &["burn"] };

const LIBRARY: Rule = Rule {
    name: "library",
    roots: &["src"],
    except: &["src/main.rs", "src/cmd.rs", "src/cmd"],
    forbidden: &["anyhow", "println!", "print!", "eprintln!", "eprint!", "dbg!"],
};

const RUNDIR: Rule = Rule {
    name: "run dir formats",
    roots: &["src/rundir.rs", "src/rundir"],
    except: &[],
    forbidden: &["crate::node", "crate::web"],
};

const PAGE: Rule = Rule {
    name: "status page",
    roots: &["src/web.rs", "src/web"],
    except: &[],
    forbidden: &["crate::node"],
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(path).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for e in entries {
            rust_files(&e, out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// Whether `line` names `word` as a path or macro: not inside a longer identifier.
fn names(line: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        // Not a longer identifier, and not a method or field (`.instant`).
        before.is_none_or(|c| !ident(c) && c != '.')
            && (word.ends_with('!') || !after.is_some_and(ident))
    })
}

/// The code part of a line (a `//` comment and anything after it dropped).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// `file:line: text` for every forbidden name in `text`.
fn violations(rule: &Rule, file: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for word in rule.forbidden {
            if names(code(line), word) {
                found.push(format!(
                    "{file}:{}: {} names `{word}`: {}",
                    n + 1,
                    rule.name,
                    line.trim()
                ));
            }
        }
    }
    found
}

fn check(rule: &Rule) -> Vec<String> {
    let base = root();
    let mut files = Vec::new();
    for r in rule.roots {
        rust_files(&base.join(r), &mut files);
    }
    assert!(!files.is_empty(), "{}: no files under {:?}", rule.name, rule.roots);
    let mut found = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&base).unwrap().to_string_lossy().into_owned();
        if rule.except.iter().any(|e| rel == *e || rel.starts_with(&format!("{e}/"))) {
            continue;
        }
        found.extend(violations(rule, &rel, &std::fs::read_to_string(&f).unwrap()));
    }
    found
}

#[test]
fn the_protocol_core_does_no_io() {
    let v = check(&CORE);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

#[test]
fn atoll_net_knows_nothing_of_training() {
    let v = check(&NET);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

#[test]
fn the_library_has_typed_errors_and_never_prints() {
    let v = check(&LIBRARY);
    assert!(v.is_empty(), "{}", v.join("\n"));
}

#[test]
fn the_run_dir_formats_and_the_page_stay_below_the_node() {
    let v: Vec<String> = [&RUNDIR, &PAGE].into_iter().flat_map(check).collect();
    assert!(v.is_empty(), "{}", v.join("\n"));
}

#[test]
fn rules_catch_what_they_forbid() {
    let bad = [
        (&CORE, "use tokio::sync::mpsc;"),
        (&CORE, "let t = std::time::Instant::now();"),
        (&CORE, "let f = std::fs::read(path)?;"),
        (&NET, "use burn::tensor::Tensor;"),
        (&LIBRARY, "pub fn run() -> anyhow::Result<()> {"),
        (&LIBRARY, "    println!(\"peer_id {id}\");"),
        (&RUNDIR, "use crate::node::Network;"),
        (&PAGE, "use crate::node::status::Endpoints;"),
    ];
    for (rule, line) in bad {
        assert_eq!(violations(rule, "x.rs", line).len(), 1, "{}: {line}", rule.name);
    }
    let fine = [
        (&CORE, "// tokio is not used here"),
        (&CORE, "let tokio_like = 1; // a name that only starts with it"),
        (&NET, "let burnt = 0;"),
        (&LIBRARY, "tracing::info!(\"not a print\");"),
        (&LIBRARY, "w.sprint!(x);"),
        (&PAGE, "use crate::rundir::status::Endpoints;"),
    ];
    for (rule, line) in fine {
        assert!(violations(rule, "x.rs", line).is_empty(), "{}: {line}", rule.name);
    }
}
