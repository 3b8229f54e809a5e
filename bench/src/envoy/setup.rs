//! The setups measured: what stands in Envoy's filter chain, their names in the report and on
//! `sluice-bench envoy --only`.

/// The lease the lease setups take.
pub const LEASE: &str = r#"{"horizon": "500ms"}"#;

/// sluice-server's threads in [`Setup::SluiceThreads`].
pub const SERVER_THREADS: usize = 2;

/// What stands in Envoy's filter chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// The router alone.
    NoFilter,
    /// A proxy-wasm filter that does nothing.
    Noop,
    /// An Envoy dynamic module that does nothing.
    NoopModule,
    /// The no-op module as the floor of a module that keys on a header and records its
    /// decision: it reads the header, bumps two counters, sets a filter state.
    FloorModule,
    /// The no-op module as the floor of a module that asks a server on every request: it
    /// reads the header, posts one check to sluice-server, and on the answer bumps two
    /// counters and sets a filter state.
    CalloutFloorModule,
    /// Envoy's native `local_ratelimit`: a token bucket per Envoy, not global.
    LocalRatelimit,
    /// sluice's filter, one callout a request.
    Sluice,
    /// sluice's filter as a native dynamic module, one callout a request.
    SluiceModule,
    /// sluice's filter as a native dynamic module, in lease mode.
    SluiceModuleLease,
    /// sluice's filter, one callout a request, to a server with [`SERVER_THREADS`] threads.
    SluiceThreads,
    /// sluice's filter in lease mode.
    SluiceLease,
    /// Envoy's native `ratelimit` filter asking sluice-server over gRPC.
    NativeGrpc,
    /// sluice's filter with a limit that denies nearly everything: the deny cache at work.
    SluiceDenying,
    /// sluice's filter in lease mode with the limit the ways in are measured over.
    SluiceLeaseLimited,
    /// sluice's module in lease mode with that limit.
    SluiceModuleLeaseLimited,
    /// Envoy's native `ratelimit` filter with that limit.
    NativeGrpcLimited,
    /// Envoy's native `rate_limit_quota` filter with that limit, sluice-server its quota
    /// service.
    RlqsLimited,
}

impl Setup {
    /// The setups measured on every key spread, in the order of the table.
    pub const COMPARED: [Setup; 12] = [
        Setup::NoFilter,
        Setup::Noop,
        Setup::NoopModule,
        Setup::FloorModule,
        Setup::LocalRatelimit,
        Setup::Sluice,
        Setup::CalloutFloorModule,
        Setup::SluiceModule,
        Setup::SluiceThreads,
        Setup::SluiceLease,
        Setup::SluiceModuleLease,
        Setup::NativeGrpc,
    ];

    /// Whether it asks sluice-server once for every request: a run of it with fewer calls than
    /// requests measured something else (callouts that never left, say).
    pub fn asks_every_request(self) -> bool {
        matches!(
            self,
            Setup::Sluice
                | Setup::SluiceModule
                | Setup::CalloutFloorModule
                | Setup::SluiceThreads
                | Setup::NativeGrpc
        )
    }

    /// Its short name, as `sluice-bench envoy --only` takes it.
    pub fn id(self) -> &'static str {
        match self {
            Setup::NoFilter => "none",
            Setup::Noop => "noop",
            Setup::NoopModule => "noop-module",
            Setup::FloorModule => "floor-module",
            Setup::CalloutFloorModule => "callout-floor-module",
            Setup::LocalRatelimit => "local",
            Setup::Sluice => "sluice",
            Setup::SluiceModule => "module",
            Setup::SluiceModuleLease => "module-lease",
            Setup::SluiceThreads => "threads",
            Setup::SluiceLease => "lease",
            Setup::NativeGrpc => "grpc",
            Setup::SluiceDenying => "denying",
            Setup::SluiceLeaseLimited => "lease-limited",
            Setup::SluiceModuleLeaseLimited => "module-lease-limited",
            Setup::NativeGrpcLimited => "grpc-limited",
            Setup::RlqsLimited => "rlqs-limited",
        }
    }

    /// Its row's name.
    pub fn name(self) -> String {
        self.name_leasing(LEASE)
    }

    /// Its row's name where its rule leases with `lease` (the lease setups when counted lease
    /// with another horizon than [`LEASE`]).
    pub fn name_leasing(self, lease: &str) -> String {
        match self {
            Setup::NoFilter => "no filter".into(),
            Setup::Noop => "no-op wasm filter".into(),
            Setup::NoopModule => "no-op dynamic module".into(),
            Setup::FloorModule => {
                "floor module (one header read, two counters, a filter state set)".into()
            }
            Setup::CalloutFloorModule => {
                "per-request floor module (one header read, a callout, two counters, a filter state set)".into()
            }
            Setup::LocalRatelimit => "native `local_ratelimit` (per Envoy)".into(),
            Setup::Sluice => "sluice wasm, per request".into(),
            Setup::SluiceModule => "sluice module, per request".into(),
            Setup::SluiceModuleLease => format!("sluice module, lease `{lease}`"),
            Setup::SluiceThreads => {
                format!("sluice wasm, per request; server `--threads {SERVER_THREADS}`")
            }
            Setup::SluiceLease => format!("sluice wasm, lease `{lease}`"),
            Setup::NativeGrpc => "native `ratelimit` -> sluice-server gRPC".into(),
            Setup::SluiceDenying => "sluice wasm, per request, denying".into(),
            Setup::SluiceLeaseLimited => format!("sluice wasm, lease `{lease}`"),
            Setup::SluiceModuleLeaseLimited => {
                format!("sluice module, lease `{lease}`")
            }
            Setup::NativeGrpcLimited => "native `ratelimit` -> sluice-server gRPC".into(),
            Setup::RlqsLimited => "native `rate_limit_quota` -> sluice-server RLQS".into(),
        }
    }
}
