//! Envoy's `rate_limit_quota` filter as a model: each request's bucket from the filter's
//! `bucket_matchers`, decided in the Envoy by its bucket's assignment, with the reports and
//! assignments of the real quota service exchanged in virtual time ([`replay`]).
//!
//! - [`config`]: the filter's configuration: domain, matchers, bucket settings.
//! - [`envoy`]: one Envoy's bucket cache, token buckets and reports, as Envoy 1.40 runs them.
//! - [`replay`]: the trace through N Envoys and the service; [`session`]: from start to report.
//!
//! A matcher input the model cannot evaluate from a trace, or a behaviour it does not model,
//! is refused at start, naming it.

pub mod config;
pub mod envoy;
pub mod replay;
pub mod session;

pub use self::config::QuotaConfig;

#[cfg(test)]
mod tests;
