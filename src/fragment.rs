//! Cutting the parameter set into `P` fragments (Streaming DiLoCo, DESIGN.md §2.2).
//!
//! A fragment is a set of whole tensors. The plan is a pure function of the tensor list,
//! so every peer of a run computes the same plan. Tensors are packed largest first into
//! the currently smallest fragment; the token embedding gets a fragment of its own because
//! it is merged with a plain weighted mean instead of RDA and is the largest tensor of a
//! small byte-level model anyway.
//!
//! This module knows names, shapes and flat `f32` buffers only; the model maps its burn
//! tensors onto it (`crate::model::params`).

use serde::{Deserialize, Serialize};

/// One parameter tensor as the fragment plan sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// Stable, unique name (module path, e.g. `blocks.0.attn.query.weight`).
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// The token embedding: merged with a plain weighted mean, never RDA.
    pub is_embedding: bool,
}

impl TensorSpec {
    /// Number of scalars.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The tensors of one fragment, in the order they are laid out in its flat buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FragmentSpec {
    /// Fragment id, `0..P`.
    pub id: usize,
    /// Tensors in flat-buffer order (sorted by name, so the order is canonical).
    pub tensors: Vec<TensorSpec>,
}

impl FragmentSpec {
    /// Number of scalars in the fragment's flat buffer.
    pub fn numel(&self) -> usize {
        self.tensors.iter().map(TensorSpec::numel).sum()
    }

    /// `(start, len)` of each tensor inside the flat buffer, in `tensors` order.
    pub fn ranges(&self) -> impl Iterator<Item = (&TensorSpec, std::ops::Range<usize>)> {
        let mut start = 0;
        self.tensors.iter().map(move |t| {
            let range = start..start + t.numel();
            start = range.end;
            (t, range)
        })
    }
}

/// Errors in building a fragment plan.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    #[error("a model needs at least one fragment")]
    ZeroFragments,
    #[error("{fragments} fragments requested but the model has only {tensors} tensors")]
    TooManyFragments { fragments: usize, tensors: usize },
    #[error("two tensors are both named {0:?}")]
    DuplicateName(String),
}

/// The split of a model's tensors into fragments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FragmentPlan {
    /// `fragments[p]` is fragment `p`.
    pub fragments: Vec<FragmentSpec>,
}

impl FragmentPlan {
    /// Splits `tensors` into `count` fragments: embeddings alone in fragment 0 (when
    /// `count > 1`), the rest bin-packed largest first into the smallest fragment.
    /// Ties break by name, so the plan never depends on the input order.
    pub fn new(tensors: &[TensorSpec], count: usize) -> Result<Self, PlanError> {
        if count == 0 {
            return Err(PlanError::ZeroFragments);
        }
        if count > tensors.len() {
            return Err(PlanError::TooManyFragments { fragments: count, tensors: tensors.len() });
        }
        let mut sorted: Vec<&TensorSpec> = tensors.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = sorted.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(PlanError::DuplicateName(w[0].name.clone()));
        }
        let mut bins: Vec<Vec<TensorSpec>> = vec![Vec::new(); count];
        let (embeddings, mut rest): (Vec<&TensorSpec>, Vec<&TensorSpec>) =
            sorted.into_iter().partition(|t| t.is_embedding && count > 1);
        let first_free = usize::from(!embeddings.is_empty());
        bins[0].extend(embeddings.into_iter().cloned());
        // Largest first; stable sort keeps name order among equals.
        rest.sort_by_key(|t| std::cmp::Reverse(t.numel()));
        let mut sizes: Vec<usize> =
            bins.iter().map(|b| b.iter().map(TensorSpec::numel).sum()).collect();
        for tensor in rest {
            let target = (first_free..count).min_by_key(|&i| (sizes[i], i)).unwrap_or(0);
            sizes[target] += tensor.numel();
            bins[target].push(tensor.clone());
        }
        let fragments = bins
            .into_iter()
            .enumerate()
            .map(|(id, mut tensors)| {
                tensors.sort_by(|a, b| a.name.cmp(&b.name));
                FragmentSpec { id, tensors }
            })
            .collect();
        Ok(Self { fragments })
    }

    /// Number of fragments `P`.
    pub fn len(&self) -> usize {
        self.fragments.len()
    }

    /// Whether the plan is empty (never true for a plan built by [`FragmentPlan::new`]).
    pub fn is_empty(&self) -> bool {
        self.fragments.is_empty()
    }

    /// Total number of scalars across fragments.
    pub fn numel(&self) -> usize {
        self.fragments.iter().map(FragmentSpec::numel).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(name: &str, shape: &[usize], emb: bool) -> TensorSpec {
        TensorSpec { name: name.into(), shape: shape.to_vec(), is_embedding: emb }
    }

    #[test]
    fn embedding_gets_its_own_fragment() {
        let tensors = vec![
            spec("emb", &[256, 64], true),
            spec("a", &[64, 64], false),
            spec("b", &[64, 64], false),
            spec("c", &[64], false),
        ];
        let plan = FragmentPlan::new(&tensors, 3).unwrap();
        assert_eq!(plan.fragments[0].tensors, vec![tensors[0].clone()]);
        assert_eq!(plan.numel(), tensors.iter().map(TensorSpec::numel).sum::<usize>());
    }

    #[test]
    fn rejects_bad_counts_and_duplicates() {
        let tensors = vec![spec("a", &[2], false)];
        assert_eq!(FragmentPlan::new(&tensors, 0), Err(PlanError::ZeroFragments));
        assert!(matches!(FragmentPlan::new(&tensors, 2), Err(PlanError::TooManyFragments { .. })));
        let dup = vec![spec("a", &[2], false), spec("a", &[3], false)];
        assert_eq!(FragmentPlan::new(&dup, 1), Err(PlanError::DuplicateName("a".into())));
    }

    proptest! {
        /// Every tensor lands in exactly one fragment, and the plan ignores input order.
        #[test]
        fn partition_is_complete_and_order_free(sizes in prop::collection::vec(1usize..500, 2..30), p in 1usize..6, seed in any::<u64>()) {
            let p = p.min(sizes.len());
            let tensors: Vec<TensorSpec> = sizes.iter().enumerate()
                .map(|(i, &n)| spec(&format!("t{i:02}"), &[n], i == 0)).collect();
            let plan = FragmentPlan::new(&tensors, p).unwrap();
            let mut names: Vec<String> = plan.fragments.iter()
                .flat_map(|f| f.tensors.iter().map(|t| t.name.clone())).collect();
            names.sort();
            let mut expected: Vec<String> = tensors.iter().map(|t| t.name.clone()).collect();
            expected.sort();
            prop_assert_eq!(names, expected);
            let mut shuffled = tensors.clone();
            let k = (seed as usize) % shuffled.len();
            shuffled.rotate_left(k);
            shuffled.reverse();
            prop_assert_eq!(FragmentPlan::new(&shuffled, p).unwrap(), plan);
        }
    }
}
