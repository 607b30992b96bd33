//! Evidence for a state before it is adopted (DESIGN.md §3.6).
//!
//! A state names its parent (the state its merge started from) and, as its log's last
//! entry, the contributions that merge took. A peer that holds that parent — its current
//! state, or the one before its latest merge or adoption, which is where a competing state
//! of the same round starts — and holds every delta listed can redo the merge: the merge
//! is deterministic, so an honest state comes out bit for bit, and anything else is a
//! forgery, whoever voted for it. A competing state whose parent this peer never held
//! (it merged the round before with another set, then merged again on top) is recomputed
//! through that parent: from the state before it and the parent's own merge, as the
//! state's log lists it (a recipe names the same by short ids). A state
//! made on a held parent that lists deltas this peer never got is checked by fetching them
//! (src/proto/check.rs); one of another lineage is weighed on its votes, never a mere
//! plurality (src/proto/catchup.rs).
//!
//! The same recomputation saves the fetch: a state announcement carries the state's
//! *recipe* (parent and merged ids), and a peer whose merge took another set than the
//! swarm's recomputes the swarm's state from the deltas it holds instead of downloading
//! the fragment's anchor and momentum (8 bytes per parameter).

use super::fasthash::{FastMap, FastSet};
use super::held::{self, merge_inputs, Held};
use super::lane::Lane;
use super::merge;
use super::schedule::Window;
use super::state::FragmentState;
use super::{PeerId, Recipe, Settings, MAX_RECIPE_IDS};
use crate::delta::{ContentHash, Limits};
use bytes::Bytes;

/// What recomputing a fetched state showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// Recomputed bit for bit from a parent and deltas this peer holds.
    Verified,
    /// Recomputing it gives another state (or it lists a delta that cannot be merged).
    Forged(String),
    /// This peer lacks the parent or a listed delta.
    Unverifiable,
}

/// Why a state was fetched rather than recomputed from its recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchCause {
    /// No credited voter of the state announced a recipe for it.
    NoRecipe,
    /// The recipe's parent is a state this peer does not hold (another lineage).
    NoParent,
    /// The recipe lists deltas this peer does not hold (nor has on their way).
    MissingDeltas,
    /// Everything was here, but the recipe did not give the state (a false recipe, or two
    /// held deltas sharing a short id).
    RecipeFailed,
    /// Fetched again: its recipes were given up on before and the last fetch failed.
    Retry,
}

impl Lane {
    /// Recomputes `new` (whose hash is `hash`) from its parent and contributions, if this
    /// peer holds them.
    pub fn evidence(
        &self,
        new: &FragmentState,
        hash: ContentHash,
        settings: &Settings,
        limits: &Limits,
    ) -> Evidence {
        let Some((round, ids)) = new.log.back().filter(|(r, _)| *r == new.round) else {
            return Evidence::Unverifiable;
        };
        let rebuilt;
        let base = match self.base(new.parent) {
            Some(base) => base,
            None => match self.rebuild_parent(new, settings, limits) {
                Some(parent) => {
                    rebuilt = parent;
                    &rebuilt
                }
                None => return Evidence::Unverifiable,
            },
        };
        match self.redo(base, new.parent, *round, ids, settings, limits) {
            Ok(redone) if redone.hash() == hash => Evidence::Verified,
            Ok(_) => Evidence::Forged(format!(
                "state of round {round} is not what its parent and its {} contribution(s) give",
                ids.len()
            )),
            Err(e) => e,
        }
    }

    /// The parent of `new`, a state this peer never held (it merged the round before with
    /// another set, or adopted another state), recomputed from a state it holds and the
    /// contributions `new`'s log lists for the parent's round: a competing lineage one
    /// merge apart is checked, not weighed on its votes. `None` when no held state gives it
    /// (or a delta is missing).
    fn rebuild_parent(
        &self,
        new: &FragmentState,
        settings: &Settings,
        limits: &Limits,
    ) -> Option<FragmentState> {
        let (mid_round, mid_ids) = new.log.iter().rev().nth(1)?;
        self.grandparents(*mid_round).find_map(|(hash, base)| {
            let parent = self.redo(base, hash, *mid_round, mid_ids, settings, limits).ok()?;
            (parent.hash() == new.parent).then_some(parent)
        })
    }

    /// The held states a parent merged in `round` may have started from (older ones).
    fn grandparents(&self, round: u64) -> impl Iterator<Item = (ContentHash, &FragmentState)> {
        let own = std::iter::once((self.state_hash, &self.state));
        let kept = [&self.prior, &self.prior_before, &self.overtaken]
            .into_iter()
            .filter_map(|s| s.as_ref().map(|(h, s)| (*h, s)));
        own.chain(kept).filter(move |(_, s)| s.round < round)
    }

    /// The contributions a check of `new` needs: its last merge's, and where this peer does
    /// not hold its parent but holds a state it may have been merged on, the parent's
    /// merge's too. `None` when nothing held can start the recomputation.
    pub(super) fn check_ids(&self, new: &FragmentState) -> Option<Vec<ContentHash>> {
        let (_, ids) = new.log.back().filter(|(r, _)| *r == new.round)?;
        if self.holds(new.parent) {
            return Some(ids.clone());
        }
        let (mid_round, mid_ids) = new.log.iter().rev().nth(1)?;
        self.grandparents(*mid_round).next()?;
        Some(ids.iter().chain(mid_ids).copied().collect())
    }

    /// The recipe of this peer's own state: its parent and its last merge's contributions,
    /// when that merge was this state's and small enough to announce.
    pub fn recipe(&self) -> Option<Recipe> {
        let (round, ids) = self.state.log.back()?;
        let listable = *round == self.state.round && self.state.round > 0;
        if !listable || ids.len() > MAX_RECIPE_IDS {
            return None;
        }
        let mut merged: Vec<u64> = ids.iter().map(ContentHash::short).collect();
        merged.sort_unstable();
        Some(Recipe { parent: self.state.parent, merged: merged.into() })
    }

    /// Keeps the recipe `from` announced for state `hash` of `round`, if `from` is a
    /// credited voter (fresh identities cannot fill the table) and the recipe is well
    /// formed. Like its vote, only a voter's latest recipe counts (and the one before it, of
    /// an earlier round: the recipe of its state's parent), so the table holds at most two
    /// per credited voter however many states a round splits into (a table of
    /// 256 by hash filled up at 64 peers, and every state after it was fetched). A false
    /// recipe costs the fetch it was meant to save, nothing more: a recomputed state
    /// counts only if it hashes right.
    pub fn note_recipe(&mut self, from: PeerId, hash: ContentHash, round: u64, recipe: Recipe) {
        let sorted = recipe.merged.windows(2).all(|w| w[0] < w[1]);
        let fits = recipe.merged.len() <= MAX_RECIPE_IDS;
        let room = self.recipes.len() < self.votes.capacity() || self.recipes.contains_key(&from);
        let newer = self.recipes.get(&from).is_none_or(|(_, r, _)| *r <= round);
        if sorted && fits && room && newer && round > 0 && self.votes.counts(&from) {
            if let Some(last) = self.recipes.insert(from, (hash, round, recipe)) {
                if last.1 < round {
                    self.recipes_before.insert(from, last);
                }
            }
        }
    }

    /// The recipe heard for state `hash` of `round`: the one most of its voters announced
    /// (every honest holder of a state announces the same recipe, so a voter lying about
    /// it needs more identities than the state has honest holders to be the one tried);
    /// ties go to the smallest voter id, the same choice on every run.
    pub(super) fn recipe_for(&self, hash: ContentHash, round: u64) -> Option<&Recipe> {
        // Each distinct recipe with its backers and its smallest voter id.
        let mut tally: FastMap<&Recipe, (usize, PeerId)> = FastMap::default();
        for (voter, (h, r, recipe)) in self.recipes.iter().chain(&self.recipes_before) {
            if *h == hash && *r == round {
                let e = tally.entry(recipe).or_insert((0, *voter));
                e.0 += 1;
                e.1 = e.1.min(*voter);
            }
        }
        tally
            .into_iter()
            .max_by_key(|(_, (backers, first))| (*backers, std::cmp::Reverse(*first)))
            .map(|(recipe, _)| recipe)
    }

    /// Forgets every recipe heard for state `hash` (one did not give it).
    pub fn drop_recipes(&mut self, hash: ContentHash) {
        self.recipes_given_up = Some(hash);
        for recipes in [&mut self.recipes, &mut self.recipes_before] {
            recipes.retain(|_, (h, _, _)| *h != hash);
        }
    }

    /// The round of state `hash` as its recipes name it (the latest, if they differ).
    fn recipe_round(&self, hash: ContentHash) -> Option<u64> {
        let all = self.recipes.values().chain(self.recipes_before.values());
        all.filter(|(h, _, _)| *h == hash).map(|(_, r, _)| *r).max()
    }

    /// State `hash` of `round`, recomputed from the recipe heard for it, when this peer
    /// holds its parent and every contribution it lists and the result hashes to `hash`;
    /// with its wire form.
    pub fn recompute(
        &self,
        hash: ContentHash,
        round: u64,
        settings: &Settings,
        limits: &Limits,
    ) -> Option<(FragmentState, Bytes)> {
        let recipe = self.recipe_for(hash, round)?;
        // A recipe names contributions by 8-byte ids (it must fit one gossip message); an id
        // two held deltas share is ambiguous, and the recipe is not used.
        let mut by_short: FastMap<u64, Option<ContentHash>> = FastMap::default();
        for h in self.held.keys() {
            by_short.entry(h.short()).and_modify(|e| *e = None).or_insert(Some(*h));
        }
        let listed = |recipe: &Recipe| -> Option<Vec<ContentHash>> {
            let mut listed: Vec<ContentHash> = recipe
                .merged
                .iter()
                .map(|id| by_short.get(id).copied().flatten())
                .collect::<Option<_>>()?;
            listed.sort_unstable();
            Some(listed)
        };
        let rebuilt_parent;
        let base = match self.base(recipe.parent) {
            Some(base) => base,
            None => {
                // The parent is a state this peer never held (it merged the round before
                // with another set, then merged again on top): recomputed first, from its
                // own recipe, on the state before it.
                let mid_round = self.recipe_round(recipe.parent).filter(|r| *r < round)?;
                let mid_recipe = self.recipe_for(recipe.parent, mid_round)?;
                let base = self.base(mid_recipe.parent)?;
                let mid_listed = listed(mid_recipe)?;
                rebuilt_parent = self
                    .redo(base, mid_recipe.parent, mid_round, &mid_listed, settings, limits)
                    .ok()?;
                if rebuilt_parent.hash() != recipe.parent {
                    return None;
                }
                &rebuilt_parent
            }
        };
        let redone =
            self.redo(base, recipe.parent, round, &listed(recipe)?, settings, limits).ok()?;
        let bytes = redone.to_bytes();
        (ContentHash::of(&bytes) == hash).then(|| (redone, bytes.into()))
    }

    /// The short ids of the contributions that the recipe heard for state `hash` of
    /// `round` lists and this peer does not hold, when it holds the recipe's parent; `None`
    /// without a recipe or a parent.
    pub fn recipe_missing(&self, hash: ContentHash, round: u64) -> Option<Vec<u64>> {
        let recipe = self.recipe_for(hash, round)?;
        self.base(recipe.parent)?;
        let held: FastSet<u64> = self.held.keys().map(ContentHash::short).collect();
        Some(recipe.merged.iter().copied().filter(|id| !held.contains(id)).collect())
    }

    /// Why state `hash` of `round` cannot be recomputed here (it is fetched instead), for
    /// operators and for measuring what catch-up still misses.
    pub fn why_fetched(&self, hash: ContentHash, round: u64) -> FetchCause {
        if self.recipes_given_up == Some(hash) {
            return FetchCause::Retry;
        }
        let Some(recipe) = self.recipe_for(hash, round) else { return FetchCause::NoRecipe };
        if self.base(recipe.parent).is_none() {
            return FetchCause::NoParent;
        }
        match self.recipe_missing(hash, round) {
            Some(missing) if !missing.is_empty() => FetchCause::MissingDeltas,
            _ => FetchCause::RecipeFailed,
        }
    }

    /// Drops the state before `prior` once this peer's state is the one most of the swarm
    /// holds for its round: the swarm's next states then descend from states held here, so
    /// the grandparent is not needed (it costs 8 bytes a parameter).
    pub fn forget_settled_grandparent(&mut self) {
        if self.prior_before.is_none() {
            return;
        }
        let round = self.state.round;
        let settled = self.votes.leader(round).is_some_and(|l| l.hash == self.state_hash);
        if settled {
            self.prior_before = None;
        }
    }

    /// Whether every contribution `new`'s last merge lists is one this peer holds or heard
    /// its author announce: an honest merge takes nothing else, and a state that lists
    /// deltas nobody announced (made up to be impossible to check) is not taken on a
    /// lineage's votes. (An announcement lost on the way costs an honest state one round.)
    pub(super) fn plausible(&self, new: &FragmentState) -> bool {
        let Some((_, ids)) = new.log.back().filter(|(r, _)| *r == new.round) else {
            return false;
        };
        let announced: FastSet<&ContentHash> = self.claims.values().collect();
        ids.iter().all(|h| self.listed_delta(h).is_some() || announced.contains(h))
    }

    /// Whether this peer holds the state named `parent`.
    pub(super) fn holds(&self, parent: ContentHash) -> bool {
        self.base(parent).is_some()
    }

    /// Whether most of `round`'s counted voters hold states they claim were merged on the
    /// parent `new` names, a state this peer does not hold and its own state was not merged
    /// on (see `accept_state`). A peer of that lineage that no longer holds the parent (it
    /// adopted a sibling, and let the parent go) has nothing to learn from the others'
    /// votes: a state made up on the lineage's parent would win them.
    pub(super) fn lineage_backs(&self, round: u64, new: &FragmentState) -> bool {
        let (kin, voters) = self.votes.lineage(round, new.parent);
        let other = new.parent != self.state.parent && self.base(new.parent).is_none();
        other && 2 * kin > voters
    }

    /// Whether `new` (hash `hash`), a state of another lineage, is the one to follow in a
    /// swarm whose lineages came apart: no parent holds most of `round`'s counted voters
    /// (a peer reconciled a round too late and merged on its own state, or a partition
    /// healed; from then on no state of the other lineage is one it can recompute, and
    /// strict states never took one on votes, so a 3-peer run kept a lineage per peer to
    /// its end, and a 2 | 2 partition two). It is, when:
    /// - its parent is the lineage most voters claim, ties to the smaller parent hash
    ///   ([`super::reconcile::Votes::ruling_lineage`]), and not this peer's own: every peer
    ///   ranks the lineages alike, so they all end in one, and a peer leaves its lineage
    ///   only for a larger one or one as large that wins the tie;
    /// - the lineage settled on it ([`Lane::settled`]; 6 attackers of 14 took a split-off
    ///   peer over without this);
    /// - most of every counted voter has voted for the round (colluders vote first), and its
    ///   log lists nothing unannounced ([`Lane::plausible`]).
    pub(super) fn leads_apart(&self, round: u64, hash: ContentHash, new: &FragmentState) -> bool {
        let votes = &self.votes;
        let Some(ruling) = votes.ruling_lineage(round) else { return false };
        !ruling.majority
            && ruling.parent == new.parent
            && new.parent != self.state.parent
            && self.settled(round, hash, new.parent)
            && votes.round_is_in(round)
            && self.plausible(new)
    }

    /// Whether more than half of `round`'s counted voters that claim states merged on
    /// `parent` hold state `hash`: the lineage settled on it. Honest peers of a lineage
    /// reconcile to one state each round; colluders who vote one made-up state on an honest
    /// lineage's parent lead it by holders while its honest peers each hold their own merge,
    /// but never hold most of it unless they outnumber its honest peers.
    pub(super) fn settled(&self, round: u64, hash: ContentHash, parent: ContentHash) -> bool {
        let (kin, _) = self.votes.lineage(round, parent);
        2 * self.votes.holders(round, hash).len() > kin
    }

    /// The state named `parent`, if this peer holds it: its own, the two before its latest
    /// merges or adoptions, or one that arrived too late to adopt.
    fn base(&self, parent: ContentHash) -> Option<&FragmentState> {
        if parent == self.state_hash {
            return Some(&self.state);
        }
        [&self.prior, &self.prior_before, &self.overtaken]
            .into_iter()
            .find_map(|s| s.as_ref().filter(|(h, _)| *h == parent).map(|(_, s)| s))
    }

    /// The state of `round` that merging the contributions `listed` (sorted) on `base`, the
    /// state named `parent`, gives; `Unverifiable` when this peer lacks a delta, `Forged`
    /// when a listed delta makes the merge non-finite.
    fn redo(
        &self,
        base: &FragmentState,
        parent: ContentHash,
        round: u64,
        listed: &[ContentHash],
        settings: &Settings,
        limits: &Limits,
    ) -> Result<FragmentState, Evidence> {
        let table: FastMap<ContentHash, Held>;
        let source = if self.listed.is_empty() {
            &self.held
        } else {
            table = listed
                .iter()
                .filter_map(|h| self.listed_delta(h).map(|d| (*h, d.clone())))
                .collect();
            &table
        };
        if !listed.iter().all(|h| source.contains_key(h)) {
            return Err(Evidence::Unverifiable);
        }
        let decoded = held::decode(source, &self.spec, listed, settings, limits);
        if decoded.len() != listed.len() {
            return Err(Evidence::Unverifiable);
        }
        let mut inputs = merge_inputs(&decoded);
        merge::canonical_order(&mut inputs);
        let step = merge::robust_step(
            &self.spec,
            &mut inputs,
            &base.anchor,
            &base.momentum,
            settings,
            base.sampling.outer(settings.raw()),
        );
        if !step.dropped.is_empty() {
            return Err(Evidence::Forged(format!(
                "state of round {round} merges {} contribution(s) that make the merge non-finite",
                step.dropped.len()
            )));
        }
        let mut redone = base.clone();
        redone.anchor = step.anchor;
        redone.momentum = step.momentum;
        redone.round = round;
        redone.parent = parent;
        let w = Window::of(settings);
        let late = self.made_before(listed, round);
        redone.record_merge(
            round,
            listed.to_vec(),
            late,
            w.log_rounds(),
            settings.raw().contributors,
        );
        Ok(redone)
    }
}
