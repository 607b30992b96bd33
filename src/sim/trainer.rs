//! A cheap stand-in for training: noisy SGD on a quadratic, on flat `f32` buffers.
//!
//! Loss of peer `i`: `½ Σ a_j (θ_j − c_j − b_ij)²` where `c` is the shared optimum, `a` the
//! curvatures and `b_i` a per-peer shift (non-IID data). Steps happen lazily: the trainer
//! is advanced to the current time only when the protocol asks for a snapshot or hands an
//! anchor over, so a thousand peers cost nothing between rounds.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The shared problem.
#[derive(Debug, Clone)]
pub struct Problem {
    pub optimum: Vec<f32>,
    pub curvature: Vec<f32>,
}

impl Problem {
    pub fn new(numel: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9);
        let optimum = (0..numel).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let curvature = (0..numel).map(|_| rng.random_range(0.2f32..1.0)).collect();
        Self { optimum, curvature }
    }

    /// The global loss of `theta` (no shift, no noise).
    pub fn loss(&self, theta: &[f32]) -> f64 {
        self.loss_at(0, theta)
    }

    /// The global loss of the parameters from `start` on, set to `values` (the problem is
    /// separable: the others add the same to any two values compared): what a simulated
    /// peer's validation finds for one fragment's anchor.
    pub fn loss_at(&self, start: usize, values: &[f32]) -> f64 {
        let (optimum, curvature) = (self.optimum.get(start..), self.curvature.get(start..));
        values
            .iter()
            .zip(optimum.unwrap_or_default())
            .zip(curvature.unwrap_or_default())
            .map(|((&t, &c), &a)| 0.5 * f64::from(a) * f64::from(t - c).powi(2))
            .sum()
    }
}

/// One peer's learner.
#[derive(Debug, Clone)]
pub struct Trainer {
    pub theta: Vec<f32>,
    shift: Vec<f32>,
    /// Duration of one inner step of this peer, in ms.
    pub step_ms: f64,
    /// Simulated time up to which steps have been taken.
    clock: f64,
    pub steps: u64,
    /// No steps beyond this many.
    pub limit: Option<u64>,
    lr: f32,
    noise: f32,
    rng: ChaCha8Rng,
}

impl Trainer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        theta: Vec<f32>,
        heterogeneity: f32,
        step_ms: f64,
        lr: f32,
        noise: f32,
        now: u64,
        seed: u64,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let shift =
            theta.iter().map(|_| rng.random_range(-heterogeneity..=heterogeneity)).collect();
        Self { theta, shift, step_ms, clock: now as f64, steps: 0, limit: None, lr, noise, rng }
    }

    /// Takes all inner steps that fit before `now`.
    pub fn advance(&mut self, now: u64, problem: &Problem) {
        while self.clock + self.step_ms <= now as f64 {
            if self.limit.is_some_and(|l| self.steps >= l) {
                self.clock = now as f64;
                return;
            }
            self.clock += self.step_ms;
            self.steps += 1;
            for (j, t) in self.theta.iter_mut().enumerate() {
                let g = problem.curvature[j] * (*t - problem.optimum[j] - self.shift[j]);
                let xi: f32 = self.rng.random_range(-1.0f32..1.0);
                *t -= self.lr * (g + self.noise * xi);
            }
        }
    }

    /// Resumes at `now` without the steps a dead peer could not have taken.
    pub fn resume_at(&mut self, now: u64) {
        self.clock = now as f64;
    }

    /// When the trainer, stepping on from its clock, completes its `n`-th step.
    pub fn time_of_step(&self, n: u64) -> u64 {
        (self.clock + n.saturating_sub(self.steps) as f64 * self.step_ms).ceil() as u64
    }

    /// When the inner step running at `now` ends.
    pub fn step_end(&self, now: u64) -> u64 {
        let mut t = self.clock;
        while t < now as f64 {
            t += self.step_ms;
        }
        t.ceil() as u64
    }

    /// `θ ← α·θ + (1−α)·anchor` on `range`.
    pub fn apply(&mut self, range: std::ops::Range<usize>, anchor: &[f32], alpha: f32) {
        for (t, &a) in self.theta[range].iter_mut().zip(anchor) {
            *t = alpha * *t + (1.0 - alpha) * a;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_steps_reduce_the_loss() {
        let p = Problem::new(32, 1);
        let mut t = Trainer::new(vec![0.0; 32], 0.0, 10.0, 0.1, 0.01, 0, 2);
        let before = p.loss(&t.theta);
        t.advance(500, &p);
        assert_eq!(t.steps, 50);
        assert!(p.loss(&t.theta) < 0.2 * before);
    }
}
