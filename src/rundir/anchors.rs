//! The protocol's replicated fragment states on disk (`RUN_DIR/anchors/fragment-P.state`),
//! so a restarted peer resumes from its last merged anchors and momentum.
//!
//! Each file is the state's wire bytes followed by their blake3, written atomically.
//! Beside each state, `fragment-P.residual` holds the fragment's error-feedback residual
//! (what the peer's deltas have not sent yet: little-endian f32, then their blake3), so a
//! restarted peer continues it instead of losing what top-k left out.

use std::path::{Path, PathBuf};

use crate::checkpoint::write_atomic;
use crate::fragment::{FragmentPlan, FragmentSpec};
use crate::proto::FragmentState;

/// Directory of the state files inside a run dir.
pub const DIR_NAME: &str = "anchors";

fn path(run_dir: &Path, fragment: usize) -> PathBuf {
    run_dir.join(DIR_NAME).join(format!("fragment-{fragment}.state"))
}

fn residual_path(run_dir: &Path, fragment: usize) -> PathBuf {
    run_dir.join(DIR_NAME).join(format!("fragment-{fragment}.residual"))
}

/// Writes one fragment's error-feedback residual.
pub fn save_residual(run_dir: &Path, fragment: u32, residual: &[f32]) -> std::io::Result<()> {
    let mut bytes: Vec<u8> = residual.iter().flat_map(|v| v.to_le_bytes()).collect();
    let hash = blake3::hash(&bytes);
    bytes.extend_from_slice(hash.as_bytes());
    write_atomic(&residual_path(run_dir, fragment as usize), &bytes)
}

/// Loads one fragment's residual: `Ok(None)` when none was saved; an error names the
/// file when it is truncated, corrupt, of another size or not finite.
pub fn load_residual(run_dir: &Path, spec: &FragmentSpec) -> Result<Option<Vec<f32>>, String> {
    let p = residual_path(run_dir, spec.id);
    let len = match std::fs::metadata(&p) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", p.display())),
    };
    // The size is checked before anything is read: a damaged file allocates nothing.
    let want = (spec.numel() as u64).saturating_mul(4).saturating_add(32);
    if len != want {
        return Err(format!("{}: {len} bytes, expected {want}", p.display()));
    }
    let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    if bytes.len() as u64 != want {
        return Err(format!("{}: {} bytes, expected {want}", p.display(), bytes.len()));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(format!("{}: checksum mismatch (corrupt or truncated)", p.display()));
    }
    let values: Vec<f32> =
        body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if values.iter().any(|v| !v.is_finite()) {
        return Err(format!("{}: holds a non-finite value", p.display()));
    }
    Ok(Some(values))
}

/// Writes one fragment's state.
pub fn save(run_dir: &Path, state: &FragmentState) -> std::io::Result<()> {
    let mut bytes = state.to_bytes();
    let hash = blake3::hash(&bytes);
    bytes.extend_from_slice(hash.as_bytes());
    write_atomic(&path(run_dir, state.fragment as usize), &bytes)
}

/// Loads every fragment's state. `Ok(None)` when the run dir holds none (a fresh peer);
/// an error names the file that is missing, truncated or corrupt.
pub fn load(run_dir: &Path, plan: &FragmentPlan) -> Result<Option<Vec<FragmentState>>, String> {
    if !run_dir.join(DIR_NAME).exists() {
        return Ok(None);
    }
    let mut states = Vec::with_capacity(plan.len());
    for spec in &plan.fragments {
        let p = path(run_dir, spec.id);
        let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if bytes.len() < 32 {
            return Err(format!("{}: truncated", p.display()));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(format!("{}: checksum mismatch (corrupt or truncated)", p.display()));
        }
        let state =
            FragmentState::from_bytes(body, spec).map_err(|e| format!("{}: {e}", p.display()))?;
        states.push(state);
    }
    Ok(Some(states))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::TensorSpec;

    #[test]
    fn round_trip_and_corruption_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![
            TensorSpec { name: "emb".into(), shape: vec![8, 2], is_embedding: true },
            TensorSpec { name: "w".into(), shape: vec![3, 3], is_embedding: false },
        ];
        let plan = FragmentPlan::new(&tensors, 2).unwrap();
        assert_eq!(load(dir.path(), &plan).unwrap(), None);
        let states: Vec<FragmentState> = plan
            .fragments
            .iter()
            .map(|f| FragmentState::initial(f.id as u32, vec![0.5; f.numel()]))
            .collect();
        for s in &states {
            save(dir.path(), s).unwrap();
        }
        assert_eq!(load(dir.path(), &plan).unwrap(), Some(states));
        let f = path(dir.path(), 1);
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        let e = load(dir.path(), &plan).unwrap_err();
        assert!(e.contains("checksum"), "{e}");
        std::fs::write(&f, &bytes[..5]).unwrap();
        assert!(load(dir.path(), &plan).unwrap_err().contains("truncated"));
    }

    #[test]
    fn a_residual_round_trips_and_damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![TensorSpec { name: "w".into(), shape: vec![5], is_embedding: false }];
        let plan = FragmentPlan::new(&tensors, 1).unwrap();
        let spec = &plan.fragments[0];
        assert_eq!(load_residual(dir.path(), spec).unwrap(), None);
        let r = vec![0.25, -1.5, 0.0, 3.0, -0.125];
        save_residual(dir.path(), 0, &r).unwrap();
        assert_eq!(load_residual(dir.path(), spec).unwrap(), Some(r.clone()));
        let f = residual_path(dir.path(), 0);
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[3] ^= 0x40;
        std::fs::write(&f, &bytes).unwrap();
        assert!(load_residual(dir.path(), spec).unwrap_err().contains("checksum"));
        std::fs::write(&f, &bytes[..7]).unwrap();
        assert!(load_residual(dir.path(), spec).unwrap_err().contains("expected 52"));
        save_residual(dir.path(), 0, &[f32::NAN, 0.0, 0.0, 0.0, 0.0]).unwrap();
        assert!(load_residual(dir.path(), spec).unwrap_err().contains("non-finite"));
    }
}
