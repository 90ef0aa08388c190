//! Rules of the house that the compiler does not check, checked on the
//! source tree (docs/architecture.md, "Invariants and layering"):
//!
//! - no library function returns `Result<_, String>`: libraries return
//!   `thiserror` enums, so a caller can tell the cases apart (the CLI
//!   shell in `sidecar/src/` and test code are exempt);
//! - every workspace member opts into the workspace lints, which include
//!   `unsafe_op_in_unsafe_fn` and `clippy::undocumented_unsafe_blocks`;
//! - every crate with no `unsafe` code says `#![forbid(unsafe_code)]`, so
//!   the first unsafe block in it is a decision, not an accident;
//! - no two files of `smartmig-core` import each other, even through
//!   others, nor two of smartmigd's library (one file-level import graph
//!   of production code: `crate::`, `super::` and `self::` paths, paths
//!   through a module's own children, each item of a `use` group; for
//!   core, a module's own submodules and parents left out), and the
//!   daemon's server layers point down;
//! - every crate root (library, binary) turns on `clippy::too_many_lines`
//!   (100 lines, clippy's default), so no production function in any
//!   crate grows past it (scripts/test runs clippy with `-D warnings`);
//! - the product is apart from the lab: smartmigd's library, and the
//!   package that builds the `smartmigd` binary a node installs, link no
//!   lab, trainer or plotting crate (`cargo metadata`, `cargo tree`; the
//!   plugin's own check is `slurm-plugin/tests/lean_deps.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace's packages, as directories relative to the root (`.` is
/// the root package), from the root manifest's `members`.
fn packages() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("the root Cargo.toml has a `members` line");
    let mut out: Vec<PathBuf> = line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(PathBuf::from)
        .collect();
    assert!(out.len() > 3, "members not understood: {line}");
    out.push(PathBuf::from("."));
    out
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The text of a source file with its comment lines blanked (so line
/// numbers stay) and without the test module at its end (`#[cfg(test)]`
/// followed by `mod`); string literals are kept (none of them looks like a
/// signature).
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if !t.starts_with("//") {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Files that only a `#[cfg(test)] mod name;` declaration includes.
fn test_only_modules(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "#[cfg(test)]" {
                continue;
            }
            let Some(name) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("mod "))
                .and_then(|l| l.strip_suffix(';'))
            else {
                continue;
            };
            let dir = match f.file_name().and_then(|n| n.to_str()) {
                Some("lib.rs" | "mod.rs" | "main.rs") => f.parent().unwrap().to_path_buf(),
                _ => f.with_extension(""),
            };
            out.push(dir.join(format!("{name}.rs")));
            out.push(dir.join(name).join("mod.rs"));
        }
    }
    out
}

/// Functions that still return `Result<_, String>`, by file prefix and
/// name, each with the reason it is allowed for now.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "sidecar/daemon/src/server/",
    "admit",
    "the connection cap's refusal; the daemon's restructuring (issue 40, item 1) moves it",
)];

/// The return types `Result<_, String>` in `code`, as (function name,
/// line, text): each `-> Result<` whose second type argument (angle
/// brackets matched) is `String`.
fn string_results(code: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("-> Result<") {
        let args = &code[at + "-> Result<".len()..];
        let (mut depth, mut comma, mut end) = (0i32, None, None);
        for (i, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => comma = Some(i),
                _ => {}
            }
        }
        if let (Some(c), Some(e)) = (comma, end) {
            if args[c + 1..e].trim() == "String" {
                let before = &code[..at];
                let name = before.rfind("fn ").map_or("", |f| {
                    before[f + 3..]
                        .split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next()
                        .unwrap_or("")
                });
                let text = args[..e].split_whitespace().collect::<Vec<_>>().join(" ");
                out.push((
                    name.to_string(),
                    before.lines().count(),
                    format!("-> Result<{text}>"),
                ));
            }
        }
    }
    out
}

#[test]
fn no_library_function_returns_a_string_error() {
    let mut found = Vec::new();
    for pkg in packages() {
        // The `smartmig` package's src/ is the CLI shell (anyhow), the
        // root package's src/ the tests' helpers.
        if pkg == Path::new("sidecar") || pkg == Path::new(".") {
            continue;
        }
        let files = rust_files(&root().join(&pkg).join("src"));
        let test_only = test_only_modules(&files);
        for f in files.iter().filter(|f| !test_only.contains(f)) {
            let code = production_code(&std::fs::read_to_string(f).unwrap());
            let rel = f
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            for (name, line, text) in string_results(&code) {
                let allowed = ALLOWED
                    .iter()
                    .any(|(prefix, n, _)| rel.starts_with(prefix) && name == *n);
                if !allowed {
                    found.push(format!("{rel}:{line}: fn {name} {text}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "library functions return Result<_, String> (give them a thiserror enum):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    let hits = string_results("fn a(x: u8) -> Result<Vec<(u8, String)>, String> {");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].0, "a");
    assert!(string_results("fn a() -> Result<String, Error> {").is_empty());
    assert!(string_results("fn a() -> Result<HashMap<String, String>, E> {").is_empty());
    let code = production_code("fn a() {}\n// -> Result<(), String>\n#[cfg(test)]\nmod tests {\n fn b() -> Result<(), String> {}\n}\n");
    assert!(string_results(&code).is_empty(), "{code}");
}

/// The lines of `code` that take or name a lock, as (line, text).
fn lock_sites(code: &str) -> Vec<(usize, String)> {
    const SIGNS: &[&str] = &[
        ".lock()",
        ".try_lock()",
        ".read()",
        ".write()",
        "Mutex<",
        "RwLock<",
        "Mutex::new",
        "RwLock::new",
    ];
    code.lines()
        .enumerate()
        .filter(|(_, l)| SIGNS.iter().any(|s| l.contains(s)))
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

/// smartmigd's books are the only door to node state: no `.lock()`,
/// `.read()`, `.write()` nor any `Mutex`/`RwLock` in the daemon's
/// production code outside `server/books/` (docs/architecture.md, "Who
/// owns node state"), with no exemption: the I/O edges own their handles
/// instead of locking them (the journal's writer thread owns the log file,
/// the XID thread owns the NVML watcher, the sim's devices are their
/// files).
#[test]
fn the_books_hold_every_lock_of_the_daemon() {
    let src = root().join("sidecar/daemon/src");
    let mut found = Vec::new();
    for f in rust_files(&src) {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("server/books/") {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for (line, text) in lock_sites(&code) {
            found.push(format!("sidecar/daemon/src/{rel}:{line}: {text}"));
        }
    }
    assert!(
        found.is_empty(),
        "locks outside sidecar/daemon/src/server/books/ (reach node state through the books' doors):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_lock_checker_sees_what_it_must() {
    let code = "let a = m.lock().unwrap();\nstruct S(std::sync::Mutex<u8>);\nlet n = file.read(&mut buf);\nlet g = rw.write();\n";
    let lines: Vec<usize> = lock_sites(code).iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, [1, 2, 4]);
}

/// The module path of a source file under `src` (`server/books/mod.rs`:
/// `["server", "books"]`; `lib.rs`: `[]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The identifier path starting at `s` (`a::b::{c, d}`): its segments, and
/// the first segment of each item of a trailing `{..}` group.
fn path_at(s: &str) -> (Vec<String>, Vec<String>) {
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segs.push(rest[..end].to_string());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => return (segs, Vec::new()),
        }
    }
    let group = rest
        .strip_prefix('{')
        .and_then(|g| g.split('}').next())
        .map(|g| {
            g.split(',')
                .filter_map(|i| i.trim().split("::").next())
                .map(|i| i.trim().to_string())
                .filter(|i| !i.is_empty())
                .collect()
        })
        .unwrap_or_default();
    (segs, group)
}

/// The modules (named `a::b`, the crate root `""`) whose items `code`,
/// the production code of module `me`, names: `crate::`, `super::` and
/// `self::` paths, paths through its own child modules, and each item of a
/// `use` group, each resolved to the longest module prefix of the path.
/// Visibility paths (`pub(in crate::x)`) are not imports; the crate root
/// and `me` itself are left out.
fn imports_of(me: &[String], code: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<String> {
    let code = code.replace("pub(in crate::", "pub(in ");
    let mut to = BTreeSet::new();
    let mut add = |m: Vec<String>| {
        if m != me && !m.is_empty() {
            to.insert(m.join("::"));
        }
    };
    for (at, _) in code.match_indices("::") {
        // Only the first `::` of a path is looked at.
        let start = code[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        if start == at || code[..start].ends_with(':') {
            continue;
        }
        let (segs, group) = path_at(&code[start..]);
        let (mut base, mut rest) = match segs[0].as_str() {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (me.to_vec(), &segs[1..]),
            "super" => {
                let mut b = me.to_vec();
                let mut r = &segs[..];
                while r.first().is_some_and(|s| s == "super") {
                    b.pop();
                    r = &r[1..];
                }
                (b, r)
            }
            // A child module of this file, named relatively.
            first if modules.contains(&[me, &[first.to_string()]].concat()) => {
                (me.to_vec(), &segs[..])
            }
            _ => continue,
        };
        while let Some(s) = rest.first() {
            let next = [base.clone(), vec![s.clone()]].concat();
            if !modules.contains(&next) {
                break;
            }
            base = next;
            rest = &rest[1..];
        }
        if rest.is_empty() && !group.is_empty() {
            for item in &group {
                let m = [base.clone(), vec![item.clone()]].concat();
                add(if modules.contains(&m) {
                    m
                } else {
                    base.clone()
                });
            }
        } else {
            add(base);
        }
    }
    to
}

/// The file-level import graph of the crate in `src`: for each module
/// (`a::b`), the modules its production code names ([`imports_of`]).
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    files
        .iter()
        .map(|f| {
            let me = module_of(src, f);
            let code = production_code(&std::fs::read_to_string(f).unwrap());
            (me.join("::"), imports_of(&me, &code, &modules))
        })
        .collect()
}

/// The import circles of `graph`: its strongly connected components of
/// more than one module (Tarjan), each sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, (usize, usize)>,
        stack: Vec<&'g str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            self.index.insert(v, (self.next, self.next));
            self.next += 1;
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                match self.index.get(w).copied() {
                    None => {
                        self.visit(w);
                        let low = self.index[w].1.min(self.index[v].1);
                        self.index.get_mut(v).unwrap().1 = low;
                    }
                    Some((i, _)) if self.stack.contains(&w) => {
                        let low = i.min(self.index[v].1);
                        self.index.get_mut(v).unwrap().1 = low;
                    }
                    Some(_) => {}
                }
            }
            let (i, low) = self.index[v];
            if i == low {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

/// smartmigd's files import one way: no circle in the daemon crate's
/// file-level import graph (docs/architecture.md, "The daemon's
/// concurrency", layers).
#[test]
fn the_daemon_has_no_import_circle() {
    let graph = import_graph(&root().join("sidecar/daemon/src"));
    assert!(
        graph
            .get("server")
            .is_some_and(|s| s.contains("server::context")),
        "the graph misses server -> server::context: {graph:?}"
    );
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles in sidecar/daemon/src: {found:?}"
    );
}

/// The server's layers, top first (docs/architecture.md, "The daemon's
/// concurrency"): a module of `sidecar/daemon/src/server/` by the first
/// component under `server/`.
const SERVER_LAYERS: &[&[&str]] = &[
    &["", "transport", "http", "start", "run", "reload"],
    &["handle", "epoch", "view", "advise", "sample"],
    &[
        "instances",
        "queue",
        "reap",
        "requeue",
        "room",
        "redact",
        "job_record",
        "holds",
        "xid",
        "shadow",
        "gpu_order",
    ],
    &[
        "books", "services", "live", "auth", "context", "clock", "panic",
    ],
];

/// The layer of a module under `server` (`None`: not in the table).
fn server_layer(module: &str) -> Option<usize> {
    let rest = module.strip_prefix("server")?;
    let first = rest
        .trim_start_matches("::")
        .split("::")
        .next()
        .unwrap_or("");
    SERVER_LAYERS.iter().position(|l| l.contains(&first))
}

/// The server's layers point down: no file of `server/` imports one of a
/// layer above its own, and every file is in the table.
#[test]
fn the_server_layers_point_down() {
    let graph = import_graph(&root().join("sidecar/daemon/src"));
    let mut up = Vec::new();
    for (from, tos) in graph.iter().filter(|(m, _)| m.starts_with("server")) {
        let Some(mine) = server_layer(from) else {
            up.push(format!("{from}: not in SERVER_LAYERS"));
            continue;
        };
        for to in tos.iter().filter(|m| m.starts_with("server")) {
            if server_layer(to).is_some_and(|theirs| theirs < mine) {
                up.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports up the server's layers:\n{}",
        up.join("\n")
    );
}

/// The graph builder and the circle finder, on small cases: what each
/// kind of path resolves to, and circles found (a self-import is none).
#[test]
fn the_circle_checker_sees_what_it_must() {
    let modules: BTreeSet<Vec<String>> = ["", "a", "a::b", "a::b::e", "a::c", "d"]
        .iter()
        .map(|m| {
            m.split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .collect();
    let me = ["a".to_string(), "b".to_string()];
    let named = imports_of(
        &me,
        "use super::c::X; use crate::d::Y; use super::Z; use self::e::W; pub(in crate::d) fn f() {}",
        &modules,
    );
    assert_eq!(
        named,
        BTreeSet::from(["a", "a::b::e", "a::c", "d"].map(String::from))
    );
    let named = imports_of(&me, "use super::{c, Z}; fn g() { e::h() }", &modules);
    assert_eq!(
        named,
        BTreeSet::from(["a", "a::b::e", "a::c"].map(String::from))
    );
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in [
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("d", "a"),
        ("e", "e"),
        ("c", "w"),
    ] {
        g.entry(from.into()).or_default().insert(to.into());
    }
    assert_eq!(circles(&g), [["a", "b", "c"]]);
    g.entry("a::x".into()).or_default().insert("a".into());
    g.entry("a".into()).or_default().insert("a::x".into());
    assert_eq!(circles(&g), [["a", "a::x", "b", "c"]]);
    assert_eq!(circles(&across_trees(g)), [["a", "b", "c"]]);
    let (segs, group) = path_at("super::{queue, books::Gpu}; x");
    assert_eq!(
        (segs, group),
        (
            vec!["super".to_string()],
            vec!["queue".to_string(), "books".to_string()]
        )
    );
}

#[test]
fn every_member_uses_the_workspace_lints() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    for lint in [
        "unsafe_op_in_unsafe_fn = \"warn\"",
        "undocumented_unsafe_blocks = \"warn\"",
    ] {
        assert!(manifest.contains(lint), "root Cargo.toml lacks `{lint}`");
    }
    for pkg in packages() {
        let path = root().join(&pkg).join("Cargo.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("[lints]\nworkspace = true"),
            "{} does not opt into the workspace lints",
            path.display()
        );
    }
}

#[test]
fn crates_without_unsafe_code_forbid_it() {
    let mut missing = Vec::new();
    for pkg in packages() {
        let src = root().join(&pkg).join("src");
        let files = rust_files(&src);
        let has_unsafe = files.iter().any(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .flat_map(|l| l.split(|c: char| !c.is_alphanumeric() && c != '_'))
                .any(|w| w == "unsafe")
        });
        if has_unsafe {
            continue;
        }
        let roots = files.iter().filter(|f| {
            f.parent() == Some(src.join("bin").as_path())
                || f.file_name()
                    .is_some_and(|n| n == "lib.rs" || n == "main.rs")
                    && f.parent() == Some(src.as_path())
        });
        for r in roots {
            let text = std::fs::read_to_string(r).unwrap();
            if !text.contains("#![forbid(unsafe_code)]") {
                missing.push(r.display().to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "crates with no unsafe code that do not `#![forbid(unsafe_code)]`:\n{}",
        missing.join("\n")
    );
}

/// The crate roots of `pkg`: `src/lib.rs`, `src/main.rs` and `src/bin/*.rs`.
fn crate_roots(pkg: &Path) -> Vec<PathBuf> {
    let src = root().join(pkg).join("src");
    rust_files(&src)
        .into_iter()
        .filter(|f| {
            f.parent() == Some(src.join("bin").as_path())
                || f.file_name()
                    .is_some_and(|n| n == "lib.rs" || n == "main.rs")
                    && f.parent() == Some(src.as_path())
        })
        .collect()
}

#[test]
fn every_crate_root_limits_function_length() {
    let mut missing = Vec::new();
    let mut roots = 0;
    for pkg in packages() {
        for r in crate_roots(&pkg) {
            roots += 1;
            let text = std::fs::read_to_string(&r).unwrap();
            let on = text.lines().any(|l| {
                let l = l.trim();
                l.starts_with("#![") && l.contains("warn(clippy::too_many_lines)")
            });
            if !on {
                missing.push(r.display().to_string());
            }
        }
    }
    assert!(roots > 10, "only {roots} crate roots found");
    assert!(
        missing.is_empty(),
        "crate roots without `#![warn(clippy::too_many_lines)]`:\n{}",
        missing.join("\n")
    );
}

/// The crates in `package`'s normal dependency tree (`cargo tree`).
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "--offline", "-p", package, "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(root())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The crates of `crates` that belong to the lab, the trainer or the
/// plots: none of them may reach a node.
fn lab_crates(crates: &[String]) -> Vec<String> {
    let mut lab: Vec<String> = crates
        .iter()
        .filter(|c| {
            ["smartmig", "smartmig-lab", "smartmig-learn"].contains(&c.as_str())
                || c.starts_with("candle")
                || c.starts_with("plotters")
        })
        .cloned()
        .collect();
    lab.sort();
    lab.dedup();
    lab
}

/// The workspace packages that build a binary named `bin`
/// (`cargo metadata`), so the check follows the binary wherever it moves.
fn packages_building(bin: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("a `packages` array");
    packages
        .iter()
        .filter(|p| {
            p["targets"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["name"] == bin
                        && t["kind"]
                            .as_array()
                            .is_some_and(|k| k.contains(&"bin".into()))
                })
            })
        })
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_daemon_links_no_lab() {
    let crates = normal_dependencies("smartmig-daemon");
    assert!(crates.iter().any(|c| c == "smartmig-core"), "{crates:?}");
    let lab = lab_crates(&crates);
    assert!(
        lab.is_empty(),
        "smartmig-daemon depends on {lab:?} again: {crates:?}"
    );
}

/// The binary a node installs (scripts/package stages `smartmigd`) is built
/// from a package whose whole tree is free of the lab: a library that is
/// clean does not help if the binary's package pulls the lab back in.
#[test]
fn the_installed_daemon_links_no_lab() {
    let packages = packages_building("smartmigd");
    let [package] = packages.as_slice() else {
        panic!("expected one package building `smartmigd`, found {packages:?}");
    };
    let crates = normal_dependencies(package);
    assert!(crates.iter().any(|c| c == "smartmig-daemon"), "{crates:?}");
    let lab = lab_crates(&crates);
    assert!(
        lab.is_empty(),
        "`smartmigd` is built by package `{package}`, which depends on {lab:?}: {crates:?}"
    );
}

/// The check above can fail: on the CLI's package, which has the lab and
/// (by default) the trainer, it finds them.
#[test]
fn the_lab_check_sees_the_lab() {
    let lab = lab_crates(&normal_dependencies("smartmig"));
    for name in ["smartmig-lab", "smartmig-learn", "candle-core"] {
        assert!(lab.iter().any(|c| c == name), "{name} not seen: {lab:?}");
    }
}

/// Whether module `a` is `b`'s ancestor (or `b` itself).
fn encloses(a: &str, b: &str) -> bool {
    a.is_empty() || a == b || b.starts_with(&format!("{a}::"))
}

/// `graph` without the edges between a module and its own parents or
/// submodules: smartmig-core's rule counts only imports across module
/// trees (a parent re-exporting its children is not a circle there).
fn across_trees(graph: BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    graph
        .into_iter()
        .map(|(m, to)| {
            let to = to
                .into_iter()
                .filter(|t| !encloses(&m, t) && !encloses(t, &m))
                .collect();
            (m, to)
        })
        .collect()
}

/// No two files of smartmig-core import each other, even through others
/// (the one import graph, [`across_trees`]).
#[test]
fn core_files_import_one_way() {
    let graph = across_trees(import_graph(&root().join("sidecar/core/src")));
    assert!(
        graph
            .get("sim::slurm_like")
            .is_some_and(|s| s.contains("sim::engine")),
        "the import graph misses sim::slurm_like -> sim::engine"
    );
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "files of smartmig-core that import each other (through the others listed): {found:?}"
    );
}
