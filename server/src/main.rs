//! The `sluice-server` binary: parse settings, log, serve until SIGINT or SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use sluice_server::ServerConfig;
use sluice_server::config::{Args, LogFormat};
use sluice_server::tls::TlsFor;
use tracing_subscriber::EnvFilter;

// Every request allocates a little (HTTP, JSON, the Redis command); mimalloc's thread-local
// free lists are cheaper than glibc's arenas for that (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args);
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("sluice-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &Args) {
    // Checked when the flags were read.
    let filter = EnvFilter::new(&args.log);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let config = ServerConfig::try_from(args).map_err(anyhow::Error::msg)?;
    let runtime = runtime(args.threads)?;
    runtime.block_on(async {
        let listener = sluice_server::bind(args.listen, args.listen_backlog)?;
        let grpc_listener = match args.grpc_listen {
            Some(addr) => Some(sluice_server::bind(addr, args.listen_backlog)?),
            None => None,
        };
        let grpc = match (&config.rls, &grpc_listener) {
            (None, _) => "off".to_owned(),
            (Some(_), Some(l)) => l.local_addr()?.to_string(),
            (Some(_), None) => "on the same port".to_owned(),
        };
        let tls = match &config.tls {
            None => "off",
            Some(tls) => match tls.on {
                TlsFor::All => "on every listener",
                TlsFor::Grpc => "on the gRPC listener",
            },
        };
        tracing::info!(listen = %listener.local_addr()?, %grpc, tls, topology = ?config.topology, "sluice-server started");
        sluice_server::serve_on(config, listener, grpc_listener, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// One thread: a current-thread runtime. Several: a work-stealing one, whose "run the task
/// just woken next" rule hands each Redis command to the connection's writer at once, so
/// commands that arrive together still leave in separate writes.
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads == 1 {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads > 1 {
        builder.worker_threads(threads);
    }
    builder.enable_all().build()
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        () = terminate => {}
    }
}
