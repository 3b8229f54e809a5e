//! The simulator refuses modules as Envoy refuses them.

use sluice_host::{Host, ModuleError};

fn load(wat: &str) -> Result<(), ModuleError> {
    let wasm = wat::parse_str(wat).expect("valid text format");
    Host::new().expect("host").load(&wasm).map(drop)
}

#[test]
fn a_module_importing_what_the_host_lacks_is_refused_naming_the_import() {
    let err = load(
        r#"(module
             (import "env" "proxy_log" (func (param i32 i32 i32) (result i32)))
             (import "env" "proxy_teleport" (func (param i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "proxy_abi_version_0_2_1")))"#,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Failed to load Wasm module due to a missing import: env.proxy_teleport"
    );
}

#[test]
fn a_module_importing_a_host_function_with_another_signature_is_refused() {
    let err = load(
        r#"(module
             (import "env" "proxy_log" (func (param i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "proxy_abi_version_0_2_1")))"#,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("import env.proxy_log has type"),
        "{err}"
    );
}

#[test]
fn a_module_without_an_abi_version_is_refused() {
    let err = load(r#"(module (memory (export "memory") 1))"#).unwrap_err();
    assert!(matches!(err, ModuleError::NoAbiVersion), "{err}");
}

#[test]
fn the_filter_loads_and_its_imports_are_all_provided() {
    let wasm = sluice_e2e::filter_wasm();
    Host::new()
        .expect("host")
        .load(&wasm)
        .expect("the filter loads");
}
