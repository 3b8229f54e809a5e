//! The proxy-wasm host that Envoy 1.40 is, on wasmtime: what `sluice-sim` runs the filter in,
//! and what every test of the filter drives it through. Each behaviour it copies from Envoy is
//! held against Envoy's code, and against a real Envoy 1.40, in `docs/fidelity.md`.
//!
//! - The ABI 0.2.1 as Envoy implements it, one module an area ([`memory`], [`headers`],
//!   [`buffers`], [`http_call`], [`shared_data`], [`properties`], [`metrics`], [`log`],
//!   [`control`], [`wasi`]), each adding its host calls with its own `add_to_linker` over the
//!   store's [`HostState`].
//! - What those calls read and write, owned by the Envoy around the VMs: [`header_map`],
//!   [`shared_store`], [`metric_registry`], [`log_sink`], [`stream_properties`].
//! - [`Host`] holds the engine and the linker; [`Host::load`] compiles a module (or maps what
//!   an earlier process compiled, [`compiled_cache`]) and refuses it as Envoy would: no ABI
//!   marker, or an import the host does not provide. [`Vm`] is one instance, one worker's VM,
//!   with a [`HostState`] per store.
//! - [`envoy`]: one modelled Envoy: its workers and their VMs, the VM lifecycle and reloads,
//!   the filter chain and local replies.

#![deny(missing_docs)]

pub mod abi;
pub mod buffers;
pub mod compiled_cache;
pub mod control;
pub mod envoy;
pub mod header_map;
pub mod headers;
pub mod http_call;
pub mod log;
pub mod log_sink;
pub mod memory;
pub mod metric_registry;
pub mod metrics;
pub mod properties;
pub mod shared_data;
pub mod shared_store;
pub mod state;
pub mod stream_properties;
mod vm;
pub mod wasi;

use std::collections::BTreeSet;
use std::sync::Arc;

use wasmtime::{Config, Engine, ExternType, Linker, Module, Store};

pub use state::{HostState, VmInfo};
pub use vm::{Effects, Plugin, Vm, VmFailed};

use self::compiled_cache::CompiledCache;
use self::log_sink::LogSink;
use self::metric_registry::MetricRegistry;
use self::shared_store::SharedData;

/// Why a module was refused at load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModuleError {
    /// Not a module wasmtime can compile.
    #[error("Failed to load Wasm module: {0}")]
    Compile(String),
    /// No `proxy_abi_version_*` export.
    #[error(
        "Failed to load Wasm module: no proxy_abi_version_* export, so this is not a proxy-wasm module"
    )]
    NoAbiVersion,
    /// An ABI this host does not implement.
    #[error(
        "Failed to load Wasm module: ABI {0} is not supported (this host implements 0.2.0 and 0.2.1)"
    )]
    UnsupportedAbi(String),
    /// An import the host does not provide, as Envoy words it.
    #[error("Failed to load Wasm module due to a missing import: {module}.{name}")]
    MissingImport {
        /// The import's module.
        module: String,
        /// The import's name.
        name: String,
    },
    /// An import the host provides with another type.
    #[error(
        "Failed to load Wasm module: import {module}.{name} has type {wanted}, but the host provides {provided}"
    )]
    ImportType {
        /// The import's module.
        module: String,
        /// The import's name.
        name: String,
        /// The module's type.
        wanted: String,
        /// The host's type.
        provided: String,
    },
}

/// Set (to anything) to have every loaded module's compiled functions appended to
/// `/tmp/perf-PID.map`, the format `perf report` and `scripts/name-jit.py` read: profilers
/// see the filter's machine code as anonymous addresses otherwise. Build the filter without
/// `strip` to get names (`CARGO_PROFILE_WASM_STRIP=false make wasm`).
pub const PERF_MAP_VAR: &str = "SLUICE_PERF_MAP";

fn write_perf_map(module: &Module) {
    use std::io::Write;
    let text = module.text().as_ptr() as usize;
    let mut lines = String::new();
    for f in module.functions() {
        let name = f
            .name
            .unwrap_or_else(|| format!("wasm-function[{}]", f.index.as_u32()));
        lines.push_str(&format!("{:x} {:x} {name}\n", text + f.offset, f.len));
    }
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(lines.as_bytes()));
    if let Err(e) = written {
        eprintln!("sluice-sim: writing {path}: {e}");
    }
}

/// The engine and linker, shared by every VM.
pub struct Host {
    engine: Engine,
    linker: Linker<HostState>,
    compiled: Option<CompiledCache>,
}

impl Host {
    /// A host providing every function of Envoy's proxy-wasm host.
    pub fn new() -> wasmtime::Result<Host> {
        let mut config = Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        self::log::add_to_linker(&mut linker)?;
        headers::add_to_linker(&mut linker)?;
        buffers::add_to_linker(&mut linker)?;
        properties::add_to_linker(&mut linker)?;
        http_call::add_to_linker(&mut linker)?;
        shared_data::add_to_linker(&mut linker)?;
        metrics::add_to_linker(&mut linker)?;
        control::add_to_linker(&mut linker)?;
        wasi::add_to_linker(&mut linker)?;
        Ok(Host {
            engine,
            linker,
            compiled: CompiledCache::from_env(),
        })
    }

    /// Compiles `wasm`, or maps what an earlier process compiled ([`compiled_cache`]), and
    /// checks it as Envoy does before any VM starts.
    pub fn load(&self, wasm: &[u8]) -> Result<Plugin, ModuleError> {
        let module = match &self.compiled {
            Some(cache) => cache.module(&self.engine, wasm),
            None => Module::new(&self.engine, wasm),
        }
        .map_err(|e| ModuleError::Compile(format!("{e:#}")))?;
        if std::env::var_os(PERF_MAP_VAR).is_some() {
            write_perf_map(&module);
        }
        let abi = module
            .exports()
            .filter_map(|e| {
                e.name()
                    .strip_prefix("proxy_abi_version_")
                    .map(str::to_owned)
            })
            .next()
            .ok_or(ModuleError::NoAbiVersion)?;
        if abi != "0_2_0" && abi != "0_2_1" {
            return Err(ModuleError::UnsupportedAbi(abi.replace('_', ".")));
        }
        let mut store = Store::new(&self.engine, probe_state());
        for import in module.imports() {
            let missing = || ModuleError::MissingImport {
                module: import.module().to_owned(),
                name: import.name().to_owned(),
            };
            let provided = self
                .linker
                .get(&mut store, import.module(), import.name())
                .map_err(|_| missing())?;
            if let (ExternType::Func(wanted), ExternType::Func(have)) =
                (import.ty(), provided.ty(&store))
                && !wanted.matches(&have)
            {
                return Err(ModuleError::ImportType {
                    module: import.module().to_owned(),
                    name: import.name().to_owned(),
                    wanted: wanted.to_string(),
                    provided: have.to_string(),
                });
            }
        }
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| ModuleError::Compile(format!("{e:#}")))?;
        Ok(Plugin::new(pre))
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

fn probe_state() -> HostState {
    HostState::new(
        VmInfo {
            vm_id: String::new(),
            plugin_name: String::new(),
            root_id: String::new(),
            vm_configuration: Vec::new(),
            plugin_configuration: Vec::new(),
            node_id: String::new(),
        },
        Arc::new(SharedData::default()),
        Arc::new(MetricRegistry::default()),
        Arc::new(BTreeSet::new()),
        LogSink::new(None),
    )
}
