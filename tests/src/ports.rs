//! Free loopback TCP ports: the one strategy for every listener a test starts (cluster
//! components, servers, agents, admin ports).
//!
//! Ports are drawn at random from 20000..32000, below Linux's ephemeral range (32768..60999)
//! so that outgoing connections do not take them between the check and the component's bind,
//! and each port is handed out at most once per process so parallel scenes never collide.
//! (Binding port 0 and closing would hand out ephemeral ports, which any outgoing connection
//! can take before the component binds.)

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Result};
use rand::Rng;

const LOW: u16 = 20_000;
const HIGH: u16 = 32_000;

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Returns `n` distinct ports that were free on 127.0.0.1 a moment ago.
pub fn allocate(n: usize) -> Result<Vec<u16>> {
    let mut taken = handed_out()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut rng = rand::rng();
    let mut ports = Vec::with_capacity(n);
    let mut attempts = 0;
    while ports.len() < n {
        attempts += 1;
        if attempts > 10_000 {
            bail!("no free loopback port in {LOW}..{HIGH} after {attempts} attempts");
        }
        let port = rng.random_range(LOW..HIGH);
        if taken.contains(&port) || TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        taken.insert(port);
        ports.push(port);
    }
    Ok(ports)
}

/// One port that was free on 127.0.0.1 a moment ago and that this process has not handed out.
pub fn free_port() -> Result<u16> {
    Ok(allocate(1)?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_across_calls() {
        let a = allocate(20).unwrap();
        let b = allocate(20).unwrap();
        let all: HashSet<u16> = a.iter().chain(b.iter()).copied().collect();
        assert_eq!(all.len(), 40);
        assert!(all.iter().all(|p| (LOW..HIGH).contains(p)));
    }
}
