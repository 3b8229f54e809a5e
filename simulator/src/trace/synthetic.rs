//! Synthetic traces, generated deterministically from a seed (the same seed gives the same
//! trace on every machine and version: the generator is our own splitmix64, not a library's).
//!
//! Kinds:
//! - `steady`: clients at steady Poisson rates;
//! - `bursty`: clients that alternate silence and bursts;
//! - `crawler`: a few crawlers walking the site fast, among a few quiet clients;
//! - `tenants`: API traffic from many tenants (`x-api-key`), a few of them heavy;
//! - `hot-tenants`: four tenants at 2,400, 1,200, 600 and 300 requests a second, each from 64
//!   addresses, among 10 quiet tenants (hot keys: what lease mode is for);
//! - `attack`: one client at a hundred times a normal client's rate among normal clients;
//! - `demo`: quiet visitors whose page loads fetch a burst of assets, plus crawlers and a
//!   scraper that go far beyond them (what `make demo` replays).

use super::record::TraceRecord;

/// Which traffic to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Steady Poisson clients.
    Steady,
    /// On/off bursts.
    Bursty,
    /// Crawlers among quiet clients.
    Crawler,
    /// Many API tenants.
    Tenants,
    /// A few tenants at hundreds to thousands of requests a second.
    HotTenants,
    /// One abuser at 100x among normal clients.
    Attack,
    /// Visitors, crawlers and a scraper.
    Demo,
}

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct GenOptions {
    /// The kind.
    pub kind: Kind,
    /// Seconds of traffic.
    pub seconds: u64,
    /// The seed.
    pub seed: u64,
    /// Stop after this many requests (0: no limit).
    pub max_requests: usize,
    /// Scales every client's rate.
    pub rate_scale: f64,
}

/// 2024-01-01T00:00:00Z: generated traces start here.
pub const START_US: i64 = 1_704_067_200_000_000;

/// splitmix64: small, fast, and the same everywhere.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An exponential wait with mean `mean_s` seconds, in microseconds.
    pub fn exp_us(&mut self, mean_s: f64) -> i64 {
        let u = self.unit().max(1e-12);
        (-u.ln() * mean_s * 1e6) as i64
    }
}

struct Builder {
    rng: Rng,
    end_us: i64,
    records: Vec<TraceRecord>,
}

const PAGES: [&str; 8] = [
    "/",
    "/products",
    "/products/1042",
    "/products/77",
    "/cart",
    "/search?q=shoes",
    "/about",
    "/blog/2023/12/sale",
];
const ASSETS: [&str; 6] = [
    "/static/app.js",
    "/static/app.css",
    "/images/logo.png",
    "/images/p/1042.jpg",
    "/images/p/77.jpg",
    "/fonts/inter.woff2",
];
const AGENTS: [&str; 3] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_1) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Safari/605.1.15",
];

impl Builder {
    fn push(
        &mut self,
        time_us: i64,
        client: &str,
        target: String,
        agent: &str,
        headers: &[(&str, String)],
    ) {
        if time_us >= self.end_us {
            return;
        }
        let mut all = vec![("user-agent".to_owned(), agent.to_owned())];
        all.extend(headers.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        let bytes = 200 + self.rng.below(40_000);
        self.records.push(TraceRecord {
            line: 0,
            time_us,
            client: client.to_owned(),
            method: "GET".to_owned(),
            target,
            host: Some("shop.example".to_owned()),
            status: 200,
            bytes,
            headers: all,
        });
    }

    /// A visitor: page loads every `mean_gap_s` on average, each with 5 to `max_assets` assets
    /// fetched within the following second.
    fn visitor(&mut self, client: &str, mean_gap_s: f64, max_assets: u64) {
        let agent = AGENTS[self.rng.below(AGENTS.len() as u64) as usize];
        let mut t = START_US + self.rng.exp_us(mean_gap_s);
        while t < self.end_us {
            let page = PAGES[self.rng.below(PAGES.len() as u64) as usize];
            self.push(t, client, page.to_owned(), agent, &[]);
            let assets = 5 + self.rng.below(max_assets.saturating_sub(4));
            for _ in 0..assets {
                let at = t + 20_000 + self.rng.below(900_000) as i64;
                let asset = ASSETS[self.rng.below(ASSETS.len() as u64) as usize];
                self.push(at, client, asset.to_owned(), agent, &[]);
            }
            // Nobody loads the next page within 5 s of the last.
            t += self.rng.exp_us(mean_gap_s).max(5_000_000);
        }
    }

    /// A client at a steady average rate between `from` and `to` seconds.
    fn steady(
        &mut self,
        client: &str,
        rate: f64,
        from_s: f64,
        to_s: f64,
        agent: &str,
        headers: &[(&str, String)],
    ) {
        let mut t = START_US
            .saturating_add((from_s * 1e6) as i64)
            .saturating_add(self.rng.exp_us(1.0 / rate));
        let stop = START_US
            .saturating_add((to_s * 1e6) as i64)
            .min(self.end_us);
        let mut n = 0u64;
        while t < stop {
            n += 1;
            self.push(
                t,
                client,
                format!("/products/{}", 1000 + n % 5000),
                agent,
                headers,
            );
            t += self.rng.exp_us(1.0 / rate).max(1);
        }
    }

    /// A tenant's API traffic at a steady average `rate`, with its API key, each request from
    /// one of `clients` at random (its servers, or its users).
    fn tenant(&mut self, key: &str, rate: f64, clients: &[String]) {
        let mut t = START_US + self.rng.exp_us(1.0 / rate);
        let mut n = 0u64;
        while t < self.end_us {
            n += 1;
            let client = &clients[self.rng.below(clients.len() as u64) as usize];
            let client = client.clone();
            self.push(
                t,
                &client,
                format!("/v1/orders/{}", n % 5000),
                "api-client/1.4",
                &[("x-api-key", key.to_owned())],
            );
            t += self.rng.exp_us(1.0 / rate).max(1);
        }
    }

    /// A crawler: bursts of `burst_s` seconds at `rate` per second, every `every_s` seconds.
    fn crawler(&mut self, client: &str, rate: f64, burst_s: f64, every_s: f64) {
        let agent = "Mozilla/5.0 (compatible; ExampleBot/2.1; +http://bot.example/)";
        let seconds = (self.end_us - START_US) as f64 / 1e6;
        let mut start = self.rng.unit() * every_s;
        while start < seconds {
            self.steady(client, rate, start, start + burst_s, agent, &[]);
            start += every_s * (0.5 + self.rng.unit());
        }
    }
}

/// Generates a trace, in time order.
pub fn generate(options: GenOptions) -> Vec<TraceRecord> {
    let mut b = Builder {
        rng: Rng::new(options.seed),
        end_us: START_US + options.seconds as i64 * 1_000_000,
        records: Vec::new(),
    };
    let scale = options.rate_scale.max(1e-6);
    let quiet = |i: u32| format!("198.51.{}.{}", 100 + i / 250, 1 + i % 250);
    match options.kind {
        Kind::Steady => {
            for i in 0..200 {
                let rate = scale * (0.2 + 2.0 * b.rng.unit());
                b.steady(&quiet(i), rate, 0.0, f64::MAX, AGENTS[0], &[]);
            }
        }
        Kind::Bursty => {
            for i in 0..100 {
                let rate = scale * (5.0 + 20.0 * b.rng.unit());
                let burst = 2.0 + 8.0 * b.rng.unit();
                let every = 30.0 + 60.0 * b.rng.unit();
                b.crawler(&quiet(i), rate, burst, every);
            }
        }
        Kind::Crawler => {
            for i in 0..50 {
                b.visitor(&quiet(i), 30.0 / scale, 12);
            }
            for (i, rate) in [(1u8, 40.0), (2, 25.0), (3, 60.0)] {
                b.crawler(&format!("203.0.113.{i}"), scale * rate, 20.0, 120.0);
            }
        }
        Kind::Tenants => {
            for tenant in 0..500u32 {
                // A few tenants carry most of the traffic (roughly Zipf).
                let rate = scale * 20.0 / f64::from(tenant + 1);
                let key = format!("tenant-{tenant:04}");
                b.steady(
                    &quiet(tenant % 1000),
                    rate,
                    0.0,
                    f64::MAX,
                    "api-client/1.4",
                    &[("x-api-key", key)],
                );
            }
        }
        Kind::HotTenants => {
            for (tenant, rate) in [2400.0, 1200.0, 600.0, 300.0].into_iter().enumerate() {
                let clients: Vec<String> = (0..64)
                    .map(|c| format!("10.{tenant}.{}.{}", c / 200, 1 + c % 200))
                    .collect();
                b.tenant(&format!("hot-{tenant}"), scale * rate, &clients);
            }
            for tenant in 0..10u32 {
                let client = [quiet(tenant)];
                b.tenant(&format!("quiet-{tenant:03}"), scale * 0.5, &client);
            }
        }
        Kind::Attack => {
            for i in 0..200 {
                b.steady(&quiet(i), scale * 0.5, 0.0, f64::MAX, AGENTS[1], &[]);
            }
            b.steady(
                "203.0.113.66",
                scale * 50.0,
                0.0,
                f64::MAX,
                "python-requests/2.31",
                &[],
            );
        }
        Kind::Demo => {
            for i in 0..150 {
                b.visitor(&quiet(i), 60.0 / scale, 20);
            }
            b.crawler("203.0.113.7", scale * 45.0, 15.0, 90.0);
            b.crawler("203.0.113.8", scale * 30.0, 30.0, 150.0);
            b.steady(
                "203.0.113.9",
                scale * 14.0,
                0.0,
                f64::MAX,
                "curl/8.5.0",
                &[],
            );
        }
    }
    b.records.sort_by(|x, y| {
        x.time_us
            .cmp(&y.time_us)
            .then_with(|| x.client.cmp(&y.client))
    });
    if options.max_requests > 0 {
        b.records.truncate(options.max_requests);
    }
    b.records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_trace() {
        let options = GenOptions {
            kind: Kind::Demo,
            seconds: 120,
            seed: 7,
            max_requests: 0,
            rate_scale: 1.0,
        };
        let a = generate(options);
        assert_eq!(a, generate(options));
        assert_ne!(a, generate(GenOptions { seed: 8, ..options }));
        assert!(a.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    }

    #[test]
    fn the_demo_has_quiet_visitors_and_loud_crawlers() {
        let records = generate(GenOptions {
            kind: Kind::Demo,
            seconds: 600,
            seed: 1,
            max_requests: 0,
            rate_scale: 1.0,
        });
        let peak = |client: &str| {
            let mut per_second = std::collections::HashMap::new();
            for r in records.iter().filter(|r| r.client == client) {
                *per_second.entry(r.time_us / 1_000_000).or_insert(0) += 1;
            }
            per_second.values().copied().max().unwrap_or(0)
        };
        assert!(
            peak("203.0.113.7") >= 35,
            "crawler peak {}",
            peak("203.0.113.7")
        );
        assert!(
            peak("198.51.100.1") <= 30,
            "visitor peak {}",
            peak("198.51.100.1")
        );
    }
}
