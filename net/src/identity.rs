//! The peer's ed25519 identity, persisted so that a restarted peer keeps its peer id.
//!
//! The file holds libp2p's protobuf encoding of the keypair. It is written to a temporary
//! file and renamed into place, so a crash never leaves half a key; on Unix it is private
//! to the owner. A file that exists but does not decode is an error, never silently replaced:
//! replacing it would change the peer id that others bootstrap from.

use std::fs;
use std::io::Write;
use std::path::Path;

use libp2p::identity::Keypair;

use crate::error::IdentityError;

/// Name of the key file inside a run dir.
pub const KEY_FILE_NAME: &str = "peer_key";

/// Loads the keypair at `path`, or creates and persists a new ed25519 keypair if absent.
pub fn load_or_create(path: &Path) -> Result<Keypair, IdentityError> {
    match fs::read(path) {
        Ok(bytes) => decode(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Keypair::generate_ed25519();
            write(path, &key)?;
            Ok(key)
        }
        Err(source) => Err(IdentityError::Read { path: path.to_path_buf(), source }),
    }
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Keypair, IdentityError> {
    let corrupt = |reason: String| IdentityError::Corrupt { path: path.to_path_buf(), reason };
    let key = Keypair::from_protobuf_encoding(bytes).map_err(|e| corrupt(e.to_string()))?;
    if key.clone().try_into_ed25519().is_err() {
        return Err(corrupt(format!("key type {:?}, expected ed25519", key.key_type())));
    }
    Ok(key)
}

fn write(path: &Path, key: &Keypair) -> Result<(), IdentityError> {
    let werr = |source| IdentityError::Write { path: path.to_path_buf(), source };
    let bytes = key
        .to_protobuf_encoding()
        .map_err(|e| werr(std::io::Error::other(format!("cannot encode key: {e}"))))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(werr)?;
    }
    let tmp = path.with_extension("tmp");
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(werr)?;
    f.write_all(&bytes).map_err(werr)?;
    f.sync_all().map_err(werr)?;
    fs::rename(&tmp, path).map_err(werr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_persists_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(KEY_FILE_NAME);
        let a = load_or_create(&path).unwrap();
        let b = load_or_create(&path).unwrap();
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
    }

    #[test]
    fn corrupt_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE_NAME);
        fs::write(&path, b"definitely not a key").unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("corrupt"));
        // The corrupt file is left alone.
        assert_eq!(fs::read(&path).unwrap(), b"definitely not a key");
    }
}
