//! The floor under sluice-server's decisions per second: the least an HTTP server built on
//! tokio and the Redis client can do for a decision. It reads each request by `httparse`, makes
//! the very `FCALL` sluice-server makes for the bench's check (one connection manager,
//! Redis' library loaded first), and writes one canned answer; no policy, no body parsing, no
//! metrics. `make bench` measures it in sluice-server's place at 16 connections, in the same
//! rounds, to show how much of the gap to redis-benchmark is sluice's and how much is the
//! stack's and the machine's; `sluice-bench server --standins` measures it in every one-check
//! configuration it is given (build it first: `cargo build --release -p sluice-bench --example
//! floor`, which puts it in `examples/` beside `sluice-bench`).
//!
//! `sluice-bench` starts it with the bench's limit and keyspace (`--limit`, `--keys`), and
//! polls as sluice-server does when it is given `--busy-poll-us` (the server's own poller,
//! told of each call).

#![allow(clippy::disallowed_methods)] // a benchmark baseline, timing itself

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use redis::IntoConnectionInfo;
use redis::aio::ConnectionManager;
use sluice_core::limit::Limit;
use sluice_server::busy_poll::{Activity, busy_poll};
use sluice_server::scripts::{SCRIPTS, ScriptCall, ScriptTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DECIDED: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 71\r\n\r\n{\"v\":1,\"results\":[{\"allowed\":true,\"limit\":1,\"remaining\":1,\"reset_ms\":1}]}";
const READY: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";

/// The least an HTTP server on tokio and the Redis client can do for a decision.
#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// The Redis to decide in.
    #[arg(long)]
    redis: String,
    /// The one limit every request is checked against, as JSON.
    #[arg(long, value_parser = parse_limit)]
    limit: Limit,
    /// Clients the keys are spread over.
    #[arg(long)]
    keys: u64,
    /// Poll for up to this many microseconds after each Redis call, as sluice-server does.
    #[arg(long, default_value_t = 0)]
    busy_poll_us: u64,
}

fn parse_limit(json: &str) -> Result<Limit, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    // Set up as sluice-server's own connection is (Nagle off), so the two differ in code alone.
    let info = args
        .redis
        .as_str()
        .into_connection_info()?
        .set_tcp_settings(sluice_server::store::tcp_settings());
    let mut redis = ConnectionManager::new(redis::Client::open(info)?).await?;
    SCRIPTS
        .library()
        .load_command()
        .query_async::<String>(&mut redis)
        .await?;
    let activity = Arc::new(Activity::default());
    if args.busy_poll_us > 0 {
        let budget = Duration::from_micros(args.busy_poll_us);
        tokio::spawn(busy_poll(Arc::clone(&activity), budget, |_| {}));
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let redis = redis.clone();
        let activity = Arc::clone(&activity);
        tokio::spawn(async move {
            if let Err(e) = answer(stream, redis, &activity, args.limit, args.keys).await {
                eprintln!("floor: {e:#}");
            }
        });
    }
}

/// Answers one keep-alive connection's requests, one at a time, until the client closes it.
async fn answer(
    mut stream: TcpStream,
    mut redis: ConnectionManager,
    activity: &Activity,
    limit: Limit,
    keys: u64,
) -> anyhow::Result<()> {
    let algorithm = limit.algorithm();
    let script = SCRIPTS.get(algorithm);
    let mut buffer = vec![0u8; 4096];
    for request in 0u64.. {
        let Some(is_get) = read_request(&mut stream, &mut buffer).await? else {
            return Ok(());
        };
        if is_get {
            stream.write_all(READY).await?;
            continue;
        }
        let key = format!(
            "sluice:{{bench0:client-{}}}:{}",
            request.wrapping_mul(2_654_435_761) % keys,
            algorithm.storage_code()
        );
        let now_us = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros())?;
        let call = ScriptCall::new(&limit, key.clone(), ScriptTime::Carried(now_us), 1, false);
        activity.happened();
        script
            .fcall(&[key], &call.args())
            .query_async::<redis::Value>(&mut redis)
            .await?;
        activity.happened();
        stream.write_all(DECIDED).await?;
    }
    Ok(())
}

/// Reads one request, head and `content-length` body, into `buffer`: whether it was a `GET`,
/// or `None` when the client has closed the connection.
async fn read_request(stream: &mut TcpStream, buffer: &mut [u8]) -> anyhow::Result<Option<bool>> {
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buffer[filled..]).await?;
        if n == 0 {
            return Ok(None);
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        let httparse::Status::Complete(head) = request.parse(&buffer[..filled])? else {
            continue;
        };
        let length: usize = match request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        {
            Some(h) => std::str::from_utf8(h.value)?.parse()?,
            None => 0,
        };
        // One request in flight a connection: nothing follows its body.
        if filled >= head + length {
            return Ok(Some(request.method == Some("GET")));
        }
        anyhow::ensure!(head + length <= buffer.len(), "a request over 4 KiB");
    }
}
