//! What both services share: a method's server side over the service that answers it, a
//! client of it, and tonic's codec for prost messages.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::uri::PathAndQuery;
use tonic::codegen::{Body, StdError};
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

pub use tonic::codegen::BoxFuture;

/// What a service answers: an HTTP/2 response in tonic's body.
pub type Answer = http::Response<tonic::body::Body>;

/// A request body a service reads: any HTTP body tonic can decode.
pub trait RequestBody: Body<Error: Into<StdError> + Send> + Send + 'static {}

impl<B: Body<Error: Into<StdError> + Send> + Send + 'static> RequestBody for B {}

/// A service's one method (each of Envoy's two has one), by its path.
pub trait Method {
    /// `/package.Service/Method`.
    const PATH: &'static str;
}

/// How a method's calls reach `S`, the service that answers them: one message each way, or
/// streams.
pub trait Serve<S>: Method {
    /// Answers one call.
    fn serve<B: RequestBody>(
        service: Arc<S>,
        request: http::Request<B>,
    ) -> BoxFuture<Answer, Infallible>;
}

/// The method `M` answered by the service `S`, as a gRPC service, ready to route.
pub struct Server<M, S> {
    service: Arc<S>,
    method: PhantomData<fn() -> M>,
}

impl<M, S> Server<M, S> {
    /// `service`, served.
    pub fn new(service: S) -> Self {
        Self {
            service: Arc::new(service),
            method: PhantomData,
        }
    }
}

impl<M, S> Clone for Server<M, S> {
    fn clone(&self) -> Self {
        Self {
            service: Arc::clone(&self.service),
            method: PhantomData,
        }
    }
}

impl<M: Serve<S>, S, B: RequestBody> tower_service::Service<http::Request<B>> for Server<M, S> {
    type Response = Answer;
    type Error = Infallible;
    type Future = BoxFuture<Answer, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != M::PATH {
            // gRPC's `UNIMPLEMENTED`, as tonic's generated services answer a path they lack.
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        M::serve(Arc::clone(&self.service), request)
    }
}

/// Decodes and encodes one method's messages with prost.
pub fn server<Request, Response>() -> tonic::server::Grpc<ProstCodec<Response, Request>>
where
    Request: prost::Message + Default + Send + 'static,
    Response: prost::Message + Send + 'static,
{
    tonic::server::Grpc::new(ProstCodec::default())
}

/// A client of the method `M`'s service.
pub struct Client<M> {
    inner: tonic::client::Grpc<Channel>,
    method: PhantomData<fn() -> M>,
}

impl<M> Clone for Client<M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            method: PhantomData,
        }
    }
}

impl<M: Method> Client<M> {
    /// A client of the service at `url`, connected.
    pub async fn connect(url: String) -> Result<Self, tonic::transport::Error> {
        Ok(Self::new(Endpoint::new(url)?.connect().await?))
    }

    /// A client over `channel`.
    pub fn new(channel: Channel) -> Self {
        Self {
            inner: tonic::client::Grpc::new(channel),
            method: PhantomData,
        }
    }

    /// The channel once it takes a call, and the method's path.
    pub(super) async fn ready(
        &mut self,
    ) -> Result<(&mut tonic::client::Grpc<Channel>, PathAndQuery), tonic::Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("the channel is not ready: {e}")))?;
        Ok((&mut self.inner, PathAndQuery::from_static(M::PATH)))
    }
}
