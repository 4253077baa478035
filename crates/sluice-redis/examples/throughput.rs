//! Decisions per second of the Redis limiter, strict and hybrid, at 1, 16 and 64 concurrent
//! callers, beside `redis-benchmark` running the same work against the same server (the
//! ceiling): the EVALSHA of the GCRA script with the arguments a strict check sends (captured
//! with `MONITOR`) on 16 keys, once over one connection per caller, unpipelined, and once over
//! one connection with as many commands in flight as there are callers (`-P`), which is how
//! the strict limiter's one multiplexed connection carries them. Then the measured
//! over-admission of hybrid mode with three hosts.
//!
//! Starts its own `redis-server` on a free port (install it with scripts/ensure-redis.sh).
//!
//! ```text
//! cargo run --release -p sluice-redis --example throughput
//! ```

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice::{Quota, TokenBucket};
use sluice_redis::{HybridLimiter, RedisLimiter, RedisOptions, RedisStore};

const CALLERS: [usize; 3] = [1, 16, 64];
const RUN: Duration = Duration::from_millis(1500);
const REPEATS: usize = 5;

type Error = Box<dyn std::error::Error>;

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> Result<Server, Error> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server ({e}); run scripts/ensure-redis.sh"))?;
    let server = Server(child, port);
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            return Err("redis-server did not start listening".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The EVALSHA a strict check sends, as `redis-benchmark` arguments, its key made a pattern
/// (`__rand_int__`, with `-r 16`: sixteen keys, as the callers use): read from `MONITOR`
/// while `check` runs one check of key `bench-0`.
async fn captured_command<F: Future<Output = ()>>(port: u16, check: F) -> Result<Vec<String>, Error> {
    use std::io::{BufRead, BufReader};
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(monitor.stdout.take().ok_or("no monitor output")?).lines();
    let ok = lines.next().ok_or("MONITOR closed")??;
    if ok.trim() != "OK" {
        return Err(format!("MONITOR answered {ok:?}").into());
    }
    check.await;
    let line = loop {
        let line = lines.next().ok_or("MONITOR saw no EVALSHA")??;
        if line.contains("\"EVALSHA\"") || line.contains("\"evalsha\"") {
            break line;
        }
    };
    let _ = monitor.kill();
    let _ = monitor.wait();
    // `<time> [<db> <client>] "EVALSHA" "<sha>" "1" "<key>" "<arg>" ...`: plain tokens here.
    let args: Vec<String> = line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|token| token.replace("bench-0", "bench-__rand_int__"))
        .collect();
    if args.len() < 4 || !args[3].contains("__rand_int__") {
        return Err(format!("unexpected MONITOR line: {line}").into());
    }
    Ok(args)
}

/// redis-benchmark's requests per second for `command` with `clients` connections, each with
/// `pipeline` commands in flight.
fn ceiling(port: u16, command: &[String], clients: usize, pipeline: usize) -> Result<f64, Error> {
    let requests = (clients * pipeline * 4000).clamp(20_000, 200_000).to_string();
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-c", &clients.to_string()])
        .args(["-P", &pipeline.to_string(), "-n", &requests, "-r", "16", "--csv"])
        .args(command)
        .output()?;
    let text = String::from_utf8(out.stdout)?;
    let line = text.lines().nth(1).ok_or("redis-benchmark printed no result")?;
    let rps = line
        .split(',')
        .nth(1)
        .ok_or("unexpected redis-benchmark output")?;
    Ok(rps.trim_matches('"').parse()?)
}

/// Runs `callers` tasks checking for `RUN`; returns (decisions, seconds).
async fn measure<F, Fut>(callers: usize, check: F) -> (f64, f64)
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let check = Arc::new(check);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let check = Arc::clone(&check);
        let done = Arc::clone(&done);
        tasks.spawn(async move {
            let key = format!("bench-{}", caller % 16);
            let mut n = 0;
            while started.elapsed() < RUN {
                check(key.clone()).await;
                n += 1;
                // A check answered locally never suspends: let the other callers, the sync
                // task and the connection run, as a server's request loop would.
                if n % 32 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            done.fetch_add(n, Ordering::Relaxed);
        });
    }
    while tasks.join_next().await.is_some() {}
    (
        done.load(Ordering::Relaxed) as f64,
        started.elapsed().as_secs_f64(),
    )
}

async fn over_admission(url: &str) -> Result<(), Error> {
    const HOSTS: u64 = 3;
    let quota: Quota = "2000/s burst 200".parse()?;
    let interval = Duration::from_millis(100);
    let mut hosts = Vec::new();
    for _ in 0..HOSTS {
        let store = RedisStore::connect(url, RedisOptions::default()).await?;
        let strict = RedisLimiter::builder(TokenBucket, quota)
            .unknown_key_quota(quota)
            .hosts(HOSTS)
            .prefix("over")
            .build(store)?;
        hosts.push(HybridLimiter::new(strict, interval));
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let run = Duration::from_secs(5);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..48 {
        let limiter = hosts[caller % HOSTS as usize].clone();
        let admitted = Arc::clone(&admitted);
        tasks.spawn(async move {
            while started.elapsed() < run {
                if matches!(limiter.check_n("shared", 1).await, Ok(d) if d.is_allowed()) {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let strict = 200.0 + 2000.0 * elapsed;
    let syncs: u64 = hosts.iter().map(|h| h.metrics().syncs).sum();
    let achieved = elapsed / (syncs as f64 / HOSTS as f64);
    let bound = HOSTS as f64 * (2000.0 * interval.as_secs_f64()).ceil();
    println!(
        "hybrid over-admission: 3 hosts, 2000/s burst 200, interval 100 ms (achieved {:.0} ms), {elapsed:.1} s: \
         admitted {admitted:.0}, strict limit {strict:.0}, over {:.0} ({:.2}%), bound hosts x rate x interval = {bound:.0}",
        achieved * 1000.0,
        admitted - strict,
        100.0 * (admitted - strict) / strict
    );
    Ok(())
}

// One worker thread, as redis-benchmark is one thread: client and server share the machine.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let server = start_server()?;
    let url = format!("redis://127.0.0.1:{}", server.1);
    let quota: Quota = "100000000/s".parse()?;
    // A generous timeout: this measures throughput, not the stalls of a shared machine (the
    // tests cover timeouts and the failure policy).
    let options = RedisOptions {
        timeout: Duration::from_secs(1),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&url, options.clone()).await?;
    let strict = RedisLimiter::builder(TokenBucket, quota)
        .unknown_key_quota(quota)
        .build(store)?;
    // Hybrid on its own connection and prefix, so its runs leave the strict limiter alone.
    let hybrid_store = RedisStore::connect(&url, options).await?;
    let hybrid_strict = RedisLimiter::builder(TokenBucket, quota)
        .unknown_key_quota(quota)
        .prefix("hybrid")
        .build(hybrid_store)?;
    let hybrid = HybridLimiter::new(hybrid_strict, Duration::from_millis(100));

    let command = captured_command(server.1, async {
        let _ = strict.check_n("bench-0", 1).await;
    })
    .await?;
    println!("ceiling: redis-benchmark -r 16 --csv {}", command.join(" "));
    println!("decisions per second (medians; ratios are medians of the per-repeat ratios)");
    println!(
        "callers  ceiling(c=callers)  ceiling(c=1, -P callers)  strict  strict/ceiling(-P)   hybrid  hybrid/strict"
    );
    for callers in CALLERS {
        let mut ceilings = Vec::new();
        let mut pipelined = Vec::new();
        let mut stricts = Vec::new();
        let mut hybrids = Vec::new();
        // Ratios within each repeat (ceiling and strict run back to back): the machine's load
        // drifts between repeats.
        let mut strict_ratios = Vec::new();
        let mut hybrid_ratios = Vec::new();
        for _ in 0..REPEATS {
            ceilings.push(ceiling(server.1, &command, callers, 1)?);
            pipelined.push(ceiling(server.1, &command, 1, callers)?);
            let before = strict.metrics();
            let limiter = strict.clone();
            let (_, seconds) = measure(callers, move |key| {
                let limiter = limiter.clone();
                async move { matches!(limiter.check_n(&key, 1).await, Ok(d) if d.is_allowed()) }
            })
            .await;
            // Only decisions Redis made count (a timeout under load answers by policy).
            let after = strict.metrics();
            stricts.push((after.redis_checks - before.redis_checks) as f64 / seconds);
            let by_policy = after.answered_by_policy() - before.answered_by_policy();
            if by_policy > 0 {
                println!("  (strict run at {callers} callers: {by_policy} checks timed out, not counted)");
            }
            let limiter = hybrid.clone();
            let (decisions, seconds) = measure(callers, move |key| {
                let limiter = limiter.clone();
                async move { matches!(limiter.check_n(&key, 1).await, Ok(d) if d.is_allowed()) }
            })
            .await;
            hybrids.push(decisions / seconds);
            let (p, s, h) = (
                pipelined[pipelined.len() - 1],
                stricts[stricts.len() - 1],
                decisions / seconds,
            );
            strict_ratios.push(s / p);
            hybrid_ratios.push(h / s);
        }
        let (c, p, s, h) = (
            median(ceilings),
            median(pipelined),
            median(stricts),
            median(hybrids),
        );
        println!(
            "{callers:>7}  {c:>18.0}  {p:>24.0}  {s:>6.0}  {:>17.0}%  {h:>7.0}  {:>12.1}x",
            100.0 * median(strict_ratios),
            median(hybrid_ratios)
        );
    }
    let m = strict.metrics();
    println!(
        "(medians of {REPEATS} runs of {RUN:?}; checks decided by Redis: {}, answered by the failure policy: {})",
        m.redis_checks,
        m.answered_by_policy()
    );
    over_admission(&url).await?;
    Ok(())
}
