//! The well-known types (`google.protobuf`) that Envoy's rate limit messages carry.

/// `google.protobuf.Duration`: seconds and the nanoseconds past them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Duration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds past `seconds`, below one second.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `google.protobuf.UInt32Value`: a `uint32` that can be absent.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct UInt32Value {
    /// The value.
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

/// `google.protobuf.UInt64Value`: a `uint64` that can be absent.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct UInt64Value {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}
