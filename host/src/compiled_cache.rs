//! Compiled modules kept on disk between processes, as the wasmtime CLI keeps them.
//!
//! Cranelift takes about 0.6 s of CPU to compile the filter in a test build, and every process
//! that hosts it (each test, each `sluice-sim` run) compiled it again. Here a module is
//! compiled once per filter build and engine, and later processes map the machine code from
//! the file.
//!
//! An entry is named by SHA-256 over the module's bytes and the engine's compatibility hash
//! (wasmtime's version, the target, every setting that shapes code), so a rebuilt filter or
//! another engine never finds a stale entry. Entries are written to a temporary file and
//! renamed into place, so a reader sees a whole entry or none, however many processes race.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sluice_core::hex::lower_hex;
use wasmtime::{Engine, Module};

/// Where compiled modules are kept: a directory, or `off` to compile in every process.
/// Unset, `$XDG_CACHE_HOME/sluice-sim`, else `$HOME/.cache/sluice-sim`.
pub const CACHE_DIR_VAR: &str = "SLUICE_SIM_CACHE_DIR";

/// How many entries a directory keeps; the least recently written go first. A filter's entry
/// is about 1 MB.
const KEPT_ENTRIES: usize = 32;

/// A directory of compiled modules.
#[derive(Debug, Clone)]
pub struct CompiledCache {
    dir: PathBuf,
}

impl CompiledCache {
    /// The directory [`CACHE_DIR_VAR`] names, or the user's cache directory; `None` when it is
    /// `off` or no home is known.
    pub fn from_env() -> Option<CompiledCache> {
        let dir = match std::env::var_os(CACHE_DIR_VAR) {
            Some(dir) if dir == "off" => return None,
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| {
                        std::env::var_os("HOME")
                            .filter(|d| !d.is_empty())
                            .map(|home| PathBuf::from(home).join(".cache"))
                    })?;
                base.join("sluice-sim")
            }
        };
        Some(CompiledCache::at(dir))
    }

    /// A cache in `dir`, created when first written.
    pub fn at(dir: impl Into<PathBuf>) -> CompiledCache {
        CompiledCache { dir: dir.into() }
    }

    /// `wasm` compiled by `engine`: from the cache when it holds it, else compiled and kept.
    /// The cache only ever saves time: a directory that cannot be read or written, or an entry
    /// wasmtime refuses, means compiling as if there were none.
    #[allow(unsafe_code)]
    pub fn module(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Module> {
        let Some(dir) = self.private_dir() else {
            return Module::new(engine, wasm);
        };
        let entry = dir.join(entry_name(engine, wasm));
        // SAFETY: wasmtime maps the file and runs its machine code unchecked, so it must be
        // what `Module::serialize` wrote for this engine. It is: the entry's name is the hash
        // of these bytes and of this engine's settings, only `keep` below writes entries, whole,
        // by rename, and `private_dir` refused a directory anyone but its owner may write.
        // wasmtime itself refuses an entry of another version or engine; a missing entry is an
        // error like any other, and compiles.
        if let Ok(module) = unsafe { Module::deserialize_file(engine, &entry) } {
            return Ok(module);
        }
        let module = Module::new(engine, wasm)?;
        if let Ok(bytes) = module.serialize() {
            keep(dir, &entry, &bytes);
        }
        Ok(module)
    }

    /// The directory, created private when missing; `None` when it cannot be, or when
    /// another user could write entries into it.
    fn private_dir(&self) -> Option<&Path> {
        if !self.dir.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .ok()?;
        }
        let mode = fs::metadata(&self.dir).ok()?.permissions().mode();
        (mode & 0o022 == 0).then_some(self.dir.as_path())
    }
}

fn entry_name(engine: &Engine, wasm: &[u8]) -> String {
    let mut hasher = DigestHasher(Sha256::new());
    hasher.0.update(wasm);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{}.cwasm", lower_hex(&hasher.0.finalize()))
}

/// Feeds what `Hash` writes into a SHA-256, for wasmtime's compatibility hash.
struct DigestHasher(Sha256);

impl Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Never read: the digest is.
    fn finish(&self) -> u64 {
        0
    }
}

/// Writes `bytes` as `entry`, whole or not at all, then trims the directory. A failure is
/// not reported: the next process compiles again.
fn keep(dir: &Path, entry: &Path, bytes: &[u8]) {
    let temporary = dir.join(format!(
        ".{}.{}.tmp",
        entry
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry"),
        std::process::id()
    ));
    let written = fs::File::create(&temporary)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| fs::rename(&temporary, entry));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
        return;
    }
    trim(dir);
}

fn trim(dir: &Path) {
    let Ok(read) = fs::read_dir(dir) else { return };
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = read
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if entries.len() <= KEPT_ENTRIES {
        return;
    }
    entries.sort();
    for (_, path) in &entries[..entries.len() - KEPT_ENTRIES] {
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAT: &str = r#"(module (func (export "answer") (result i32) i32.const 42))"#;

    fn answer(engine: &Engine, module: &Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        let instance = wasmtime::Instance::new(&mut store, module, &[]).unwrap();
        let f = instance
            .get_typed_func::<(), i32>(&mut store, "answer")
            .unwrap();
        f.call(&mut store, ()).unwrap()
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        found.sort();
        found
    }

    #[test]
    fn a_second_load_maps_the_kept_entry() {
        let engine = Engine::default();
        let wasm = wat::parse_str(WAT).unwrap();
        let root = tempfile::tempdir().unwrap();
        let cache = CompiledCache::at(root.path().join("cache"));

        let first = cache.module(&engine, &wasm).unwrap();
        let kept = entries(&root.path().join("cache"));
        assert_eq!(kept.len(), 1, "one entry, no temporary left: {kept:?}");
        let mode = fs::metadata(root.path().join("cache"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);

        let stamp = fs::metadata(&kept[0]).unwrap().modified().unwrap();
        let second = cache.module(&engine, &wasm).unwrap();
        assert_eq!(answer(&engine, &first), 42);
        assert_eq!(answer(&engine, &second), 42);
        assert_eq!(
            fs::metadata(&kept[0]).unwrap().modified().unwrap(),
            stamp,
            "the second load read the entry, it did not write it again"
        );
    }

    #[test]
    fn another_module_or_engine_gets_its_own_entry() {
        let wasm = wat::parse_str(WAT).unwrap();
        let other = wat::parse_str(WAT.replace("42", "7")).unwrap();
        let mut unoptimised = wasmtime::Config::new();
        unoptimised.cranelift_opt_level(wasmtime::OptLevel::None);
        let engines = [Engine::default(), Engine::new(&unoptimised).unwrap()];
        let root = tempfile::tempdir().unwrap();
        let cache = CompiledCache::at(root.path());

        for engine in &engines {
            assert_eq!(answer(engine, &cache.module(engine, &wasm).unwrap()), 42);
            assert_eq!(answer(engine, &cache.module(engine, &other).unwrap()), 7);
        }
        assert_eq!(entries(root.path()).len(), 4);
    }

    #[test]
    fn an_unreadable_entry_is_compiled_again_and_replaced() {
        let engine = Engine::default();
        let wasm = wat::parse_str(WAT).unwrap();
        let root = tempfile::tempdir().unwrap();
        let cache = CompiledCache::at(root.path());
        cache.module(&engine, &wasm).unwrap();
        let entry = entries(root.path()).remove(0);
        fs::write(&entry, b"not a compiled module").unwrap();

        assert_eq!(answer(&engine, &cache.module(&engine, &wasm).unwrap()), 42);
        assert_ne!(fs::read(&entry).unwrap(), b"not a compiled module");
    }

    #[test]
    fn a_directory_others_may_write_is_not_used() {
        let engine = Engine::default();
        let wasm = wat::parse_str(WAT).unwrap();
        let root = tempfile::tempdir().unwrap();
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let cache = CompiledCache::at(root.path());

        assert_eq!(answer(&engine, &cache.module(&engine, &wasm).unwrap()), 42);
        assert!(entries(root.path()).is_empty());
    }

    #[test]
    fn only_the_newest_entries_are_kept() {
        let root = tempfile::tempdir().unwrap();
        for i in 0..KEPT_ENTRIES + 3 {
            let path = root.path().join(format!("{i:03}.cwasm"));
            fs::write(&path, b"x").unwrap();
            let age = std::time::Duration::from_secs((KEPT_ENTRIES + 3 - i) as u64 * 60);
            let when =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30) - age;
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        trim(root.path());
        let kept = entries(root.path());
        assert_eq!(kept.len(), KEPT_ENTRIES);
        assert!(
            kept[0].ends_with("003.cwasm"),
            "the three oldest went: {kept:?}"
        );
    }
}
