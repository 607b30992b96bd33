//! Gossipsub peer scoring for one topic per run.
//!
//! The score decides whom gossipsub gossips to, publishes to and listens to at all; our
//! settings, for a swarm of tens to hundreds of peers on one topic:
//! - **P4, invalid messages** (weight -10 per squared count): every announcement that
//!   fails our envelope check is reported `Reject`, so three of them graylist the sender
//!   (-90 < -80); the count fades to 10% in ten minutes.
//! - **Application score** (weight 10): minus the standing strikes of the peer
//!   ([`crate::bans`]); two strikes stop gossip with it, four stop publishing to it, eight
//!   ban it outright.
//! - **P6, IP colocation**: beyond [`COLOCATION_THRESHOLD`] peer ids on one IP, each extra
//!   one costs quadratically (-5 × surplus²). Loopback is whitelisted only when the node
//!   listens on loopback and [`crate::NetConfig::exempt_loopback`] is set.
//! - Small positive credit for time in mesh and first deliveries (capped at 30 in all),
//!   so an honest, long-standing peer survives one strike without losing gossip.
//! - P3/P3b (mesh delivery deficits) are off: announcements are sparse (a few per round),
//!   and a quiet honest mesh peer must not look like a lazy one.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use libp2p::gossipsub::{
    score_parameter_decay, PeerScoreParams, PeerScoreThresholds, TopicHash, TopicScoreParams,
};

/// Peer ids one IP may have before the colocation penalty starts.
pub const COLOCATION_THRESHOLD: f64 = 4.0;
/// Weight of the application score (which is minus the standing strikes).
pub const APP_WEIGHT: f64 = 10.0;

/// The score parameters of a node on `topic`.
pub fn params(topic: TopicHash, whitelist_loopback: bool) -> PeerScoreParams {
    let fade = score_parameter_decay(Duration::from_secs(600));
    let topic_params = TopicScoreParams {
        topic_weight: 1.0,
        time_in_mesh_weight: 0.01,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 1000.0,
        first_message_deliveries_weight: 1.0,
        first_message_deliveries_decay: fade,
        first_message_deliveries_cap: 20.0,
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        invalid_message_deliveries_weight: -10.0,
        invalid_message_deliveries_decay: fade,
        ..TopicScoreParams::default()
    };
    let mut whitelist = HashSet::new();
    if whitelist_loopback {
        whitelist.insert(IpAddr::V4(Ipv4Addr::LOCALHOST));
        whitelist.insert(IpAddr::V6(Ipv6Addr::LOCALHOST));
    }
    PeerScoreParams {
        topics: [(topic, topic_params)].into_iter().collect(),
        topic_score_cap: 30.0,
        app_specific_weight: APP_WEIGHT,
        ip_colocation_factor_weight: -5.0,
        ip_colocation_factor_threshold: COLOCATION_THRESHOLD,
        ip_colocation_factor_whitelist: whitelist,
        ..PeerScoreParams::default()
    }
}

/// gossipsub's stock thresholds fit these weights: gossip -10, publish -50, graylist -80.
pub fn thresholds() -> PeerScoreThresholds {
    PeerScoreThresholds {
        gossip_threshold: -10.0,
        publish_threshold: -40.0,
        graylist_threshold: -80.0,
        accept_px_threshold: 10.0,
        opportunistic_graft_threshold: 5.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_validate() {
        let p = params(TopicHash::from_raw("t"), true);
        p.validate().unwrap();
        thresholds().validate().unwrap();
        assert!(p.ip_colocation_factor_whitelist.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(params(TopicHash::from_raw("t"), false).ip_colocation_factor_whitelist.is_empty());
    }
}
