//! Redis' clock, as the store reads it for [`crate::clock::RedisClock`].

use std::sync::Arc;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::{Backend, Store, StoreError};
use crate::clock::TimeSource;

/// Redis' clock by `TIME`, in microseconds since the epoch.
pub async fn read_time_us<C>(connection: &mut C) -> redis::RedisResult<i64>
where
    C: redis::aio::ConnectionLike + Send,
{
    let reply: redis::Value = redis::cmd("TIME").query_async(connection).await?;
    time_us_of(&reply)
}

/// `TIME`'s reply (seconds and microseconds), in microseconds since the epoch.
pub fn time_us_of(reply: &redis::Value) -> redis::RedisResult<i64> {
    let (seconds, micros): (i64, i64) = redis::from_redis_value_ref(reply)?;
    Ok(seconds * 1_000_000 + micros)
}

impl Store {
    /// Redis' clock, by `TIME`, in microseconds since the epoch. On a Cluster, the clock of
    /// the primary that serves slot 0: every node has its own clock, and servers that each
    /// read whichever node the client picked would carry clocks apart by the nodes' skew.
    pub async fn time_us(self: &Arc<Self>) -> Result<i64, StoreError> {
        let backend = self.backend().await?;
        self.within_timeout(None, async {
            match backend {
                Backend::Single(mut c) => read_time_us(&mut c).await,
                Backend::Cluster(mut c) => {
                    let slot_zero =
                        SingleNodeRoutingInfo::SpecificNode(Route::new(0, SlotAddr::Master));
                    let reply = c
                        .route_command(redis::cmd("TIME"), RoutingInfo::SingleNode(slot_zero))
                        .await?;
                    time_us_of(&reply)
                }
            }
        })
        .await
    }
}

impl TimeSource for Store {
    type Error = StoreError;

    async fn time_us(self: &Arc<Self>) -> Result<i64, StoreError> {
        Store::time_us(self).await
    }
}
