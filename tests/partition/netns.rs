//! The network-namespace partition's lab: two namespaces joined by a veth pair (root
//! only; the test skips elsewhere).

use std::process::Command;

/// Two network namespaces joined by a veth pair, side A at `ADDRS[0]`, side B at
/// `ADDRS[1]`; deleted (with the pair) when dropped.
pub struct Netns {
    pub names: [String; 2],
    /// The veth pair's end in the root namespace, if creating the pair half failed.
    veth: String,
}

impl Netns {
    pub const ADDRS: [&'static str; 2] = ["10.213.0.1", "10.213.0.2"];

    /// Creates the namespaces; the error says why they cannot be made (not root, no `ip`).
    pub fn setup() -> Result<Netns, String> {
        let pid = std::process::id();
        // Interface names have at most 15 bytes.
        let (va, vb) = (format!("atv{}a", pid % 10_000_000), format!("atv{}b", pid % 10_000_000));
        // Made first, so that a failed step below deletes what was made.
        let netns =
            Netns { names: [format!("atoll-{pid}-a"), format!("atoll-{pid}-b")], veth: va.clone() };
        let [a, b] = &netns.names;
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", a])?;
        ip(&["link", "set", &vb, "netns", b])?;
        for (ns, dev, addr) in [(a, &va, Self::ADDRS[0]), (b, &vb, Self::ADDRS[1])] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(netns)
    }

    /// Adds (`add`) or removes (`del`) a blackhole route to the other side in each
    /// namespace.
    pub fn blackhole(&self, op: &str) {
        for (ns, to) in [(&self.names[0], Self::ADDRS[1]), (&self.names[1], Self::ADDRS[0])] {
            let host = format!("{to}/32");
            ip(&["-n", ns, "route", op, "blackhole", &host]).unwrap();
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = ip(&["netns", "del", ns]);
        }
        // Gone with its namespace, unless moving it there failed.
        let _ = ip(&["link", "del", &self.veth]);
    }
}

/// Runs `ip ARGS`; the error has its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}
