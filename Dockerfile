# sluice-server as a container: built with the pinned toolchain, run on a slim Debian.
#
#   docker build -t sluice-server .
#   docker run -e SLUICE_REDIS=redis://redis:6379 -p 8080:8080 sluice-server
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sluice-server

FROM debian:bookworm-slim
# The authorities rediss:// URLs are checked against, unless --redis-ca-cert names others.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 sluice
COPY --from=build /src/target/release/sluice-server /usr/local/bin/sluice-server
USER sluice
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sluice-server"]
