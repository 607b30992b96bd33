//! The attacker of tests/hostile.rs: a libp2p node in the test process that read the
//! source, and what it does with each honest announcement in each [`Mode`].

use super::*;

/// Runs the attacker until `stop`; returns its libp2p peer id.
pub(crate) fn attacker(
    addrs: Vec<Multiaddr>,
    run_id: [u8; 32],
    key: std::path::PathBuf,
    crew: Arc<HashSet<atoll_net::PeerId>>,
    stop: Arc<AtomicBool>,
    mode: Mode,
) -> String {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    rt.unwrap().block_on(async move {
        let keypair = atoll_net::identity::load_or_create(&key).unwrap();
        let mut cfg = NetConfig::new(keypair, "hostile");
        cfg.listen = vec![atoll::fleet::LOOPBACK_TCP.parse().unwrap()];
        cfg.bootstrap = addrs;
        let mut node = Node::start(cfg).await.unwrap();
        let me = node.client.peer_id();
        let mut a = Attack {
            client: node.client.clone(),
            run_id,
            me: proto_peer(&me),
            done: 0,
            numel: HashMap::new(),
            mode,
            encode: run_encoding(),
            sent: HashSet::new(),
            seen: HashMap::new(),
        };
        while !stop.load(Ordering::Relaxed) {
            let ev = tokio::time::timeout(Duration::from_millis(200), node.events.recv()).await;
            let Ok(Some(NetEvent::Announcement { author: Some(author), payload, .. })) = ev else {
                continue;
            };
            if crew.contains(&author) {
                continue;
            }
            match wire::decode(&payload) {
                Ok((_, Message::Contribution(c))) if c.origin != a.me => {
                    a.on_delta(author, c).await
                }
                Ok((_, Message::State(s))) if mode == Mode::Everything => {
                    a.on_state(author, s).await
                }
                _ => {}
            }
        }
        node.handle.shutdown().await.unwrap();
        me.to_string()
    })
}

struct Attack {
    client: NetClient,
    run_id: [u8; 32],
    me: PeerId,
    /// Honest deltas attacked so far (each round gets another variant).
    done: u64,
    /// Values per fragment, learnt from the first delta fetched.
    numel: HashMap<u32, usize>,
    mode: Mode,
    /// The run's codec: a careful attacker's deltas look like everyone's.
    encode: EncodeOptions,
    /// `(fragment, round)` of the author-bound deltas sent (one each: no equivocation).
    sent: HashSet<(u32, u64)>,
    /// Honest deltas held per `(fragment, round)` by the direction attack.
    seen: HashMap<(u32, u64), Vec<Vec<f32>>>,
}

impl Attack {
    async fn publish(&self, msg: Message) {
        let _ = self.client.publish(wire::encode(&self.run_id, &msg)).await;
    }

    /// Stores `values` as a delta of ours and announces it with the given claims.
    async fn announce(
        &self,
        c: &ContributionAnnounce,
        values: &[f32],
        tokens: u64,
        steps: u64,
        codec: Codec,
    ) {
        let meta =
            DeltaMeta { author: self.me.0, fragment: c.fragment, round: c.round, tokens, steps };
        let opts = EncodeOptions { codec, ..self.encode };
        let Ok(enc) = delta::encode(meta, values, None, &opts) else { return };
        let _ = self.client.put_blob(bytes::Bytes::copy_from_slice(&enc.bytes));
        let ours = ContributionAnnounce {
            hash: enc.hash,
            size: enc.bytes.len() as u64,
            tokens,
            steps,
            origin: self.me,
            ..c.clone()
        };
        self.publish(Message::Contribution(ours)).await;
    }

    /// The author-bound attack: −10× the first honest delta of each fragment and round,
    /// under its own name with that delta's claims. `HOSTILE_SCALE` sets another factor
    /// for a measurement (e.g. −1: bench/RESULTS.md, "Influence by agreement").
    async fn author_bound(&mut self, author: atoll_net::PeerId, c: ContributionAnnounce) {
        if !self.sent.insert((c.fragment, c.round)) {
            return;
        }
        let Ok(bytes) = self.client.fetch_blob(BlobHash(c.hash.0), &[author]).await else { return };
        let Some(values) = decode_any(&bytes, c.fragment) else { return };
        let scale: f32 =
            std::env::var("HOSTILE_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(-10.0);
        let poison: Vec<f32> = values.iter().map(|v| scale * v).collect();
        self.announce(&c, &poison, c.tokens, c.steps, self.encode.codec).await;
    }

    /// The direction attack (see [`Mode::Direction`]).
    async fn direction(&mut self, author: atoll_net::PeerId, c: ContributionAnnounce) {
        let key = (c.fragment, c.round);
        if self.sent.contains(&key) {
            return;
        }
        let Ok(bytes) = self.client.fetch_blob(BlobHash(c.hash.0), &[author]).await else { return };
        let Some(values) = decode_any(&bytes, c.fragment) else { return };
        let held = self.seen.entry(key).or_default();
        held.push(values);
        if held.len() < 2 {
            return;
        }
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let norms: Vec<f32> = held.iter().map(|v| norm(v)).collect();
        let mut aim = vec![0f32; held[0].len()];
        for (v, n) in held.iter().zip(&norms) {
            for (a, x) in aim.iter_mut().zip(v) {
                *a -= if *n > 0.0 { x / n } else { 0.0 };
            }
        }
        let target = 1.9 * norms.iter().sum::<f32>() / norms.len() as f32;
        let k = if norm(&aim) > 0.0 { target / norm(&aim) } else { 0.0 };
        let poison: Vec<f32> = aim.iter().map(|a| a * k).collect();
        self.seen.remove(&key);
        self.sent.insert(key);
        self.announce(&c, &poison, c.tokens, c.steps, self.encode.codec).await;
    }

    /// The stall (see [`Mode::Stall`]): the largest delta the fragment allows, announced
    /// with every honest delta of its round, never stored, so never served.
    async fn stall(&mut self, author: atoll_net::PeerId, c: ContributionAnnounce) {
        if !self.numel.contains_key(&c.fragment) {
            let Ok(bytes) = self.client.fetch_blob(BlobHash(c.hash.0), &[author]).await else {
                return;
            };
            let Some(values) = decode_any(&bytes, c.fragment) else { return };
            self.numel.insert(c.fragment, values.len());
        }
        let size = delta::largest_payload(self.numel[&c.fragment]);
        let hash = ContentHash::of(format!("stall {} {}", c.fragment, c.round).as_bytes());
        self.sent.insert((c.fragment, c.round));
        let ours = ContributionAnnounce { hash, size, origin: self.me, ..c };
        self.publish(Message::Contribution(ours)).await;
    }

    /// Attacks 1, 2, 5, 6, 7, 13: variants of an honest delta it fetched.
    async fn on_delta(&mut self, author: atoll_net::PeerId, c: ContributionAnnounce) {
        if self.mode == Mode::AuthorBound {
            return self.author_bound(author, c).await;
        }
        if self.mode == Mode::Direction {
            return self.direction(author, c).await;
        }
        if self.mode == Mode::Idle {
            return;
        }
        if self.mode == Mode::Stall {
            return self.stall(author, c).await;
        }
        // 7 first: two different deltas of its own for the round, sent before any fetch,
        // so they are fresh even when this process lags behind the swarm.
        if let Some(&n) = self.numel.get(&c.fragment) {
            for v in [0.0f32, 1e-3] {
                self.announce(&c, &vec![v; n], c.tokens, c.steps, Codec::Q4).await;
            }
        }
        let Ok(bytes) = self.client.fetch_blob(BlobHash(c.hash.0), &[author]).await else { return };
        let Some(values) = decode_any(&bytes, c.fragment) else { return };
        self.numel.insert(c.fragment, values.len());
        self.done += 1;
        let poison: Vec<f32> = values.iter().map(|v| -10.0 * v).collect();
        // 1 + 13: the −10× delta claiming 2⁴⁰ tokens in one step (refused before fetching),
        // then with honest claims (accepted, clipped to 2× the round's median norm).
        self.announce(&c, &poison, 1 << 40, 1, Codec::Q4).await;
        if self.done % 2 == 0 {
            self.announce(&c, &poison, c.tokens, c.steps, Codec::Q4).await;
        } else {
            // 2: finite values near f32::MAX.
            let huge: Vec<f32> =
                values.iter().map(|v| if *v >= 0.0 { 3e38 } else { -3e38 }).collect();
            self.announce(&c, &huge, c.tokens, c.steps, Codec::Q8).await;
        }
        // 7: a second delta for the same round (equivocation).
        let flipped: Vec<f32> = values.iter().map(|v| -v).collect();
        self.announce(&c, &flipped, c.tokens, c.steps, Codec::Q4).await;
        // 12/13: the honest delta claimed as ours, and announced in its author's name.
        let stolen = ContributionAnnounce { origin: self.me, ..c.clone() };
        self.publish(Message::Contribution(stolen)).await;
        self.publish(Message::Contribution(c.clone())).await;
        // 5 + 6: fake hashes and far-future rounds.
        for i in 0..4u64 {
            let fake = ContributionAnnounce {
                hash: ContentHash::of(&(self.done * 16 + i).to_le_bytes()),
                round: if i % 2 == 0 { u64::MAX } else { c.round },
                origin: self.me,
                ..c.clone()
            };
            self.publish(Message::Contribution(fake)).await;
        }
    }

    /// Attacks 8, 9 and 14: votes for states that do not exist, and the same chunk of an
    /// honest state asked for again and again.
    async fn on_state(&mut self, author: atoll_net::PeerId, s: StateAnnounce) {
        for round in [s.round + 1, u64::MAX] {
            let fake =
                StateAnnounce { round, hash: ContentHash::of(&round.to_le_bytes()), ..s.clone() };
            self.publish(Message::State(fake)).await;
        }
        // In a task of its own: a peer that throttles the repeats answers late or never,
        // and waiting here would leave this attacker's later deltas for rounds already
        // closed (stale announcements are dropped before any equivocation check).
        let (client, hash) = (self.client.clone(), BlobHash(s.hash.0));
        tokio::spawn(async move {
            for _ in 0..20 {
                let _ = client.request_blob(author, BlobRequest::Chunk { hash, index: 0 }).await;
            }
        });
    }
}

/// Decodes a delta of `fragment` whatever its size (the attacker only needs its values).
fn decode_any(bytes: &[u8], fragment: u32) -> Option<Vec<f32>> {
    let numel = u32::from_le_bytes(bytes.get(36..40)?.try_into().ok()?) as usize;
    let spec = FragmentSpec {
        id: fragment as usize,
        tensors: vec![TensorSpec { name: "all".into(), shape: vec![numel], is_embedding: false }],
    };
    delta::decode(bytes, &spec, &Limits::default()).ok().map(|d| d.values)
}
