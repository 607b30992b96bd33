//! Why a training peer could not start or stopped: the library's typed errors (the
//! command line adds its own context with anyhow).

use std::path::PathBuf;

/// Why [`super::run`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error("cannot create run dir {path}: {source}")]
    RunDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error(
        "the checkpoint in {0} belongs to another run (its training settings differ from the \
         manifest's); use another run dir"
    )]
    OtherRun(PathBuf),
    #[error(transparent)]
    Train(#[from] crate::train::TrainError),
    #[error(transparent)]
    Plan(#[from] crate::fragment::PlanError),
    #[error(transparent)]
    Params(#[from] crate::model::params::ParamsError),
    #[error(transparent)]
    Protocol(#[from] crate::proto::ProtoError),
    #[error("network: {0}")]
    Net(#[from] atoll_net::NetError),
    #[error("cannot start the training thread: {0}")]
    Thread(std::io::Error),
    #[error("training stopped: {0}")]
    Training(String),
    #[error("the training thread ended unexpectedly")]
    WorkerGone,
}
