//! Network faults made with the kernel, for `make faults`: a [`Link`] is a network namespace
//! joined to this machine's by a veth pair, with a relay listening inside the namespace and
//! forwarding to a loopback target (a server replica's front, a cluster's API server). A client
//! pointed at [`Link::addr`] crosses the veth pair, so what the kernel does to that pair is what
//! the client meets:
//!
//! * [`Link::drop_packets`]: a blackhole route in the namespace swallows every reply, so
//!   connections open and new SYNs get no answer at all: a half-open link (packets dropped, not
//!   refused), as a cut cable or a firewall that drops does;
//! * [`Link::slow`]: a token-bucket filter (`tc qdisc … tbf`) on both ends limits the rate, so
//!   each request takes seconds;
//! * [`Link::refuse`]: the relay closes its listener and resets every connection, so clients
//!   meet `connection refused` (a peer that is down);
//! * [`Link::stall`]: the relay stops moving bytes on the connections already open, keeping
//!   them open, while new ones pass: a watch that stalls without closing.
//!
//! `netem` is not in this machine's kernel (`tc qdisc add … netem` answers "Specified qdisc
//! kind is unknown"), so loss is a route and delay a rate. Needs root (`ip netns`, `tc`): the
//! test machines run as root. Links are numbered per process (`10.213.<n>.0/30`, the host end
//! `.1`, the namespace end `.2`; [`LINK_ADDRESSES`] are in the test certificates' names); a link
//! left by a killed run is removed when a link of the same number is made again.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{bail, ensure, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How many links a process may make; each has its own `/30`.
pub const MAX_LINKS: u8 = 4;

/// The namespace ends of the links, as names for certificates (`10.213.<n>.2`).
pub const LINK_ADDRESSES: [&str; MAX_LINKS as usize] =
    ["10.213.0.2", "10.213.1.2", "10.213.2.2", "10.213.3.2"];

static NEXT: AtomicU8 = AtomicU8::new(0);

/// What the relay does with the bytes of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forward everything.
    Pass,
    /// Listener closed, every connection reset.
    Refuse,
    /// Connections open so far stop moving bytes (and stay open); new ones pass.
    Stall,
}

/// A network namespace, its veth pair and the relay in it; see the module docs. Dropping it
/// removes the namespace (and with it the pair) and ends the relay.
pub struct Link {
    number: u8,
    /// Where clients connect: the namespace end of the pair, the relay's port.
    pub addr: SocketAddr,
    mode: watch::Sender<(Mode, u64)>,
    relay: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Makes link number `n` of this process, relaying to `target` (a loopback address).
    pub async fn to(target: SocketAddr) -> Result<Self> {
        let number = NEXT.fetch_add(1, Ordering::SeqCst);
        ensure!(number < MAX_LINKS, "at most {MAX_LINKS} links per process");
        let (ns, host_if, ns_if) = names(number);
        let (host_ip, ns_ip) = (address(number, 1), address(number, 2));
        // Leftovers of a killed run with the same number.
        let _ = run("ip", &["netns", "del", &ns]);
        let _ = run("ip", &["link", "del", &host_if]);
        run("ip", &["netns", "add", &ns])?;
        run(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &ns,
            ],
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
        )?;
        run("ip", &["link", "set", &host_if, "up"])?;
        in_ns(
            &ns,
            &["ip", "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if],
        )?;
        in_ns(&ns, &["ip", "link", "set", &ns_if, "up"])?;
        in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;

        let port = crate::ports::free_port()?;
        let addr = SocketAddr::from((ns_ip, port));
        let (mode, _) = watch::channel((Mode::Pass, 0));
        let relay = tokio::spawn(relay(ns.clone(), addr, target, mode.subscribe()));
        let link = Self {
            number,
            addr,
            mode,
            relay,
        };
        // The relay binds in its own time: wait until a connection goes through.
        crate::wait::eventually(
            &format!("link {number} relaying {addr} to {target}"),
            std::time::Duration::from_secs(10),
            || async { Ok(TcpStream::connect(addr).await.is_ok()) },
        )
        .await?;
        Ok(link)
    }

    /// The link's namespace end as `https://<ip>:<port>`.
    pub fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Every reply from the namespace dropped (`true`) or delivered again (`false`).
    pub fn drop_packets(&self, dropped: bool) -> Result<()> {
        let (ns, _, _) = names(self.number);
        let host = address(self.number, 1).to_string();
        let verb = if dropped { "add" } else { "del" };
        in_ns(
            &ns,
            &["ip", "route", verb, "blackhole", &format!("{host}/32")],
        )
    }

    /// Both ends limited to `kbit` kilobits per second (`None`: unlimited again). The queue
    /// holds 30 s of traffic, so packets wait rather than drop.
    pub fn slow(&self, kbit: Option<u32>) -> Result<()> {
        let (ns, host_if, ns_if) = names(self.number);
        for (netns, dev) in [(None, host_if), (Some(ns), ns_if)] {
            let mut args = vec!["tc".to_string(), "qdisc".into()];
            match kbit {
                Some(rate) => args.extend(
                    [
                        "replace",
                        "dev",
                        &dev,
                        "root",
                        "tbf",
                        "rate",
                        &format!("{rate}kbit"),
                        "burst",
                        "1600",
                        "latency",
                        "30s",
                    ]
                    .map(String::from),
                ),
                None => args.extend(["del", "dev", &dev, "root"].map(String::from)),
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match &netns {
                Some(ns) => in_ns(ns, &args)?,
                None => run(args[0], &args[1..])?,
            }
        }
        Ok(())
    }

    /// The relay refuses (listener closed, connections reset).
    pub fn refuse(&self) {
        self.set(Mode::Refuse);
    }

    /// Connections open now stop moving bytes and stay open; new ones pass.
    pub fn stall(&self) {
        self.set(Mode::Stall);
    }

    /// The relay forwards again (stalled connections stay stalled until their peer closes).
    pub fn pass(&self) {
        self.set(Mode::Pass);
    }

    fn set(&self, mode: Mode) {
        self.mode.send_modify(|(m, generation)| {
            *m = mode;
            *generation += 1;
        });
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.relay.abort();
        let (ns, host_if, _) = names(self.number);
        let _ = run("ip", &["link", "del", &host_if]);
        let _ = run("ip", &["netns", "del", &ns]);
    }
}

fn names(number: u8) -> (String, String, String) {
    (
        format!("rdfault-{number}"),
        format!("rdf{number}h"),
        format!("rdf{number}n"),
    )
}

fn address(number: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 213, number, host)
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn in_ns(ns: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// A listener bound inside namespace `ns`: a socket belongs to the namespace of the thread that
/// made it, so a short-lived thread enters `ns` (`setns`) and binds; the socket stays there.
fn bind_in(ns: &str, addr: SocketAddr) -> Result<TcpListener> {
    let path = format!("/var/run/netns/{ns}");
    let listener = std::thread::scope(|s| {
        s.spawn(|| -> Result<std::net::TcpListener> {
            let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering {ns}"))?;
            Ok(std::net::TcpListener::bind(addr)?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the binding thread panicked"))?
    })?;
    listener.set_nonblocking(true)?;
    Ok(TcpListener::from_std(listener)?)
}

/// The relay: listens in the namespace while the mode is not [`Mode::Refuse`]; each
/// connection forwards to `target` until it closes, stops at [`Mode::Stall`], or is reset at
/// [`Mode::Refuse`].
async fn relay(
    ns: String,
    addr: SocketAddr,
    target: SocketAddr,
    mut mode: watch::Receiver<(Mode, u64)>,
) {
    let mut connections = JoinSet::new();
    loop {
        if mode.borrow_and_update().0 == Mode::Refuse {
            connections.abort_all();
            if mode.changed().await.is_err() {
                return;
            }
            continue;
        }
        let listener = match bind_in(&ns, addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("netfault: binding {addr} in {ns}: {e:#}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((inbound, _)) = accepted else { continue };
                    connections.spawn(forward(inbound, target, mode.clone()));
                }
                changed = mode.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if mode.borrow().0 == Mode::Refuse {
                        break;
                    }
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    }
}

/// One connection: copies both ways until either side closes; stops copying for good (keeping
/// both sockets open) once the mode turns to [`Mode::Stall`] after it opened.
async fn forward(inbound: TcpStream, target: SocketAddr, mode: watch::Receiver<(Mode, u64)>) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let opened_at = mode.borrow().1;
    let (mut in_read, mut in_write) = inbound.into_split();
    let (mut out_read, mut out_write) = outbound.into_split();
    let stalled = |m: &watch::Receiver<(Mode, u64)>| {
        let (mode, generation) = *m.borrow();
        mode == Mode::Stall && generation > opened_at
    };
    let (m1, m2) = (mode.clone(), mode.clone());
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match in_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if stalled(&m1) {
                std::future::pending::<()>().await;
            }
            if out_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = out_write.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match out_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if stalled(&m2) {
                std::future::pending::<()>().await;
            }
            if in_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = in_write.shutdown().await;
    };
    tokio::join!(up, down);
}
