//! No two modules of a crate import each other, directly or round a ring: a module's `use` of
//! `crate::`, `super::` or `self::` paths, and its mentions of its own child modules, point
//! one way only. A circle makes two files one idea split in two: neither can be read, tested
//! or moved alone. A parent that re-exports its children keeps its shared types in a child of
//! their own (as `core/src/algorithm/model.rs`), not in itself.
//!
//! The scan reads source text, not the compiler's resolution: test modules (`#[cfg(test)] mod`,
//! last in a file by this repository's habit) and comments are left out; a path is resolved
//! to the longest module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::source_tree::{CRATE_SOURCES, code_of, repository, rust_sources};

/// A module, as the path of names from its crate's root.
type Module = Vec<String>;

/// One crate: each module's file and what it imports.
struct Crate {
    name: String,
    files: BTreeMap<Module, PathBuf>,
    imports: BTreeMap<Module, BTreeSet<Module>>,
}

/// The module a file under `root` is: `a/b.rs` and `a/b/mod.rs` are `[a, b]`, the root's
/// `lib.rs` or `main.rs` is `[]`.
fn module_of(root: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(root).unwrap().with_extension("");
    let mut names: Module = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if names
        .last()
        .is_some_and(|n| n == "mod" || ((n == "lib" || n == "main") && names.len() == 1))
    {
        names.pop();
    }
    names
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifiers of a path that starts at `at` in `code`, after its first `::`, and where it
/// ends.
fn path_at(code: &str, mut at: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    while code[at..].starts_with("::") {
        let start = at + 2;
        let len = code[start..].find(|c: char| !is_ident(c)).unwrap_or(0);
        if len == 0 {
            break;
        }
        segments.push(code[start..start + len].to_owned());
        at = start + len;
    }
    (segments, at)
}

/// The first identifier of each item of the group `{...}` that starts at `open`.
fn group_heads(code: &str, open: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in code[open..].chars() {
        match c {
            '{' => {
                depth += 1;
                if depth > 1 {
                    item.push(c);
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                item.push(c);
            }
            ',' if depth == 1 => heads.push(std::mem::take(&mut item)),
            _ => item.push(c),
        }
    }
    heads.push(item);
    heads
        .iter()
        .filter_map(|item| {
            let head: String = item.trim().chars().take_while(|&c| is_ident(c)).collect();
            (!head.is_empty() && head != "self").then_some(head)
        })
        .collect()
}

/// The longest module of `files` that `path` names, from its start.
fn module_named(files: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| files.contains_key(prefix))
}

/// The modules of `files` that `module`'s `code` imports.
fn imports_of(files: &BTreeMap<Module, PathBuf>, module: &Module, code: &str) -> BTreeSet<Module> {
    let mut paths: Vec<Vec<String>> = Vec::new();
    for (at, _) in code.match_indices("::") {
        let before = &code[..at];
        let word_start = before.rfind(|c: char| !is_ident(c)).map_or(0, |i| i + 1);
        let word = &before[word_start..];
        let preceded = before[..word_start].ends_with(':') || word.is_empty();
        if preceded {
            continue;
        }
        let base: Module = match word {
            "crate" => Vec::new(),
            "self" => module.clone(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            child => {
                let mut path = module.clone();
                path.push(child.to_owned());
                if !files.contains_key(&path) {
                    continue;
                }
                path
            }
        };
        let (segments, end) = path_at(code, at);
        let mut base = base;
        let mut segments = segments.into_iter().peekable();
        while segments.peek().is_some_and(|s| s == "super") {
            segments.next();
            base.pop();
        }
        let mut full = base;
        full.extend(segments);
        if code[end..].starts_with("::{") {
            for head in group_heads(code, end + 2) {
                let mut item = full.clone();
                item.push(head);
                paths.push(item);
            }
        } else {
            paths.push(full);
        }
    }
    paths
        .iter()
        .filter_map(|path| module_named(files, path))
        .filter(|target| target != module)
        .collect()
}

fn read_crate(root: &Path, skip: Option<&Path>) -> Crate {
    let mut sources = rust_sources(root, skip);
    // A library's `main.rs` beside its `lib.rs` is a binary of its own, using the library by
    // its crate name: not a module of the library.
    if root.join("lib.rs").exists() {
        sources.retain(|file| *file != root.join("main.rs"));
    }
    let files: BTreeMap<Module, PathBuf> = sources
        .into_iter()
        .map(|file| (module_of(root, &file), file))
        .collect();
    let imports = files
        .iter()
        .map(|(module, file)| {
            let code = code_of(&std::fs::read_to_string(file).unwrap());
            (module.clone(), imports_of(&files, module, &code))
        })
        .collect();
    Crate {
        name: root.display().to_string(),
        files,
        imports,
    }
}

/// The crates under the repository: each source root, and each binary under `src/bin`.
fn crates() -> Vec<Crate> {
    let repository = repository();
    let mut crates = Vec::new();
    for dir in CRATE_SOURCES {
        let root = repository.join(dir);
        let bins = root.join("bin");
        crates.push(read_crate(&root, Some(&bins)));
        for entry in std::fs::read_dir(&bins).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                crates.push(read_crate(&entry.path(), None));
            }
        }
    }
    crates
}

/// The groups of two or more modules that reach each other (Tarjan's strongly connected
/// components).
fn circles(imports: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        imports: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, module: &'a Module) {
            let order = self.index.len();
            self.index.insert(module, (order, order));
            self.stack.push(module);
            for next in self.imports.get(module).into_iter().flatten() {
                let low = match self.index.get(next) {
                    None => {
                        self.visit(next);
                        self.index[next].1
                    }
                    Some(&(next_order, _)) if self.stack.contains(&next) => next_order,
                    Some(_) => continue,
                };
                let entry = self.index.get_mut(module).unwrap();
                entry.1 = entry.1.min(low);
            }
            let (order, low) = self.index[module];
            if order == low {
                let at = self.stack.iter().rposition(|m| *m == module).unwrap();
                let group: Vec<Module> = self.stack.drain(at..).cloned().collect();
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        imports,
        index: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for module in imports.keys() {
        if !walk.index.contains_key(module) {
            walk.visit(module);
        }
    }
    walk.found
}

fn shown(module: &Module) -> String {
    if module.is_empty() {
        "<root>".to_owned()
    } else {
        module.join("::")
    }
}

#[test]
fn no_two_modules_import_each_other() {
    let crates = crates();
    let modules: usize = crates.iter().map(|c| c.files.len()).sum();
    assert!(
        modules > 200,
        "only {modules} modules read: is the scan reading the sources?"
    );
    let mut found = Vec::new();
    for krate in &crates {
        for group in circles(&krate.imports) {
            let members: BTreeSet<&Module> = group.iter().collect();
            let mut lines = vec![format!(
                "{}: {}",
                krate.name,
                group.iter().map(shown).collect::<Vec<_>>().join(", ")
            )];
            for module in &group {
                for target in &krate.imports[module] {
                    if members.contains(target) {
                        lines.push(format!("    {} -> {}", shown(module), shown(target)));
                    }
                }
            }
            found.push(lines.join("\n"));
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other:\n{}",
        found.join("\n")
    );
}

/// The scan itself: each way a module names another is an edge, and a ring is found.
#[test]
fn the_scan_finds_every_way_a_module_names_another() {
    let modules = ["", "a", "a/b", "a/c", "d"];
    let files: BTreeMap<Module, PathBuf> = modules
        .iter()
        .map(|m| {
            let module: Module = m
                .split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            (module, PathBuf::from(m))
        })
        .collect();
    let module = |s: &str| -> Module {
        s.split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let code = code_of(
        "use super::c::Thing;\nuse crate::{d::X, a::Y};\n// use crate::nothing::Z;\nfn f() { self::inner(); }\n#[cfg(test)]\nmod tests {\n    use crate::*;\n}\n",
    );
    let found = imports_of(&files, &module("a/b"), &code);
    assert_eq!(
        found,
        BTreeSet::from([module("a/c"), module("d"), module("a")])
    );
    let parent = imports_of(&files, &module("a"), "pub use b::Thing;\nuse super::d;\n");
    assert_eq!(parent, BTreeSet::from([module("a/b"), module("d")]));
    let ring = BTreeMap::from([
        (module("a"), BTreeSet::from([module("a/b")])),
        (module("a/b"), BTreeSet::from([module("d")])),
        (module("d"), BTreeSet::from([module("a")])),
        (module("a/c"), BTreeSet::from([module("a")])),
    ]);
    let groups = circles(&ring);
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].len(), 3);
}
