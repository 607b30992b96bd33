//! The model's parameters as named flat `f32` buffers: the interface the protocol uses.
//!
//! Tensor names are module paths (`blocks.layers.0.mha.query.weight`), gathered with a
//! burn `ModuleVisitor`; writing goes through a `ModuleMapper` that swaps in new values
//! while keeping each parameter's id (so the inner optimizer's state still matches) and
//! its gradient setting.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};

use super::Lm;
use crate::fragment::{FragmentSpec, TensorSpec};

/// Name of the token-embedding weight (merged with a plain mean, own fragment).
pub const EMBEDDING_TENSOR: &str = "token_emb.weight";

/// Errors in moving flat buffers in or out of a model.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParamsError {
    #[error("fragment {fragment} holds {expected} values but {actual} were given")]
    WrongLength { fragment: usize, expected: usize, actual: usize },
    #[error("the model has no tensor named {0:?}")]
    UnknownTensor(String),
    #[error("tensor {name:?} has shape {actual:?} in the model but {expected:?} in the fragment")]
    ShapeMismatch { name: String, expected: Vec<usize>, actual: Vec<usize> },
    #[error("tensor {0:?} could not be read as f32")]
    NotF32(String),
}

/// Tracks the module path while burn walks the model.
#[derive(Default)]
struct Path(Vec<String>);

impl Path {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_owned());
    }
    fn exit(&mut self) {
        self.0.pop();
    }
    fn name(&self) -> String {
        self.0.join(".")
    }
}

/// Every float parameter of `model`, in burn's visiting order.
pub fn tensor_specs(model: &Lm) -> Vec<TensorSpec> {
    struct Specs {
        path: Path,
        out: Vec<TensorSpec>,
    }
    impl ModuleVisitor for Specs {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let name = self.path.name();
            let is_embedding = name == EMBEDDING_TENSOR;
            self.out.push(TensorSpec { name, shape: param.lazy_shape().to_vec(), is_embedding });
        }
    }
    let mut visitor = Specs { path: Path::default(), out: Vec::new() };
    model.visit(&mut visitor);
    visitor.out
}

/// Reads the named tensors of `model` as flat buffers.
fn read_named(
    model: &Lm,
    wanted: &BTreeMap<&str, &TensorSpec>,
) -> Result<BTreeMap<String, Vec<f32>>, ParamsError> {
    struct Reader<'a> {
        path: Path,
        wanted: &'a BTreeMap<&'a str, &'a TensorSpec>,
        out: BTreeMap<String, Result<Vec<f32>, ParamsError>>,
    }
    impl ModuleVisitor for Reader<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let name = self.path.name();
            let Some(spec) = self.wanted.get(name.as_str()) else { return };
            let value = param.val();
            let shape = value.dims().to_vec();
            let result = if shape != spec.shape {
                Err(ParamsError::ShapeMismatch {
                    name: name.clone(),
                    expected: spec.shape.clone(),
                    actual: shape,
                })
            } else {
                value.into_data().try_to_vec::<f32>().map_err(|_| ParamsError::NotF32(name.clone()))
            };
            self.out.insert(name, result);
        }
    }
    let mut reader = Reader { path: Path::default(), wanted, out: BTreeMap::new() };
    model.visit(&mut reader);
    let mut out = BTreeMap::new();
    for name in wanted.keys() {
        match reader.out.remove(*name) {
            Some(values) => out.insert((*name).to_owned(), values?),
            None => return Err(ParamsError::UnknownTensor((*name).to_owned())),
        };
    }
    Ok(out)
}

/// Fragment `spec` of `model` as one flat buffer (tensors in `spec.tensors` order).
pub fn read_fragment(model: &Lm, spec: &FragmentSpec) -> Result<Vec<f32>, ParamsError> {
    let wanted: BTreeMap<&str, &TensorSpec> =
        spec.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut tensors = read_named(model, &wanted)?;
    let mut flat = Vec::with_capacity(spec.numel());
    for tensor in &spec.tensors {
        // `read_named` returns every wanted name or an error.
        if let Some(values) = tensors.remove(&tensor.name) {
            flat.extend_from_slice(&values);
        }
    }
    Ok(flat)
}

/// Checks that `spec` describes tensors `model` has, with the same shapes.
pub fn check_fragment(model: &Lm, spec: &FragmentSpec) -> Result<(), ParamsError> {
    let specs = tensor_specs(model);
    for tensor in &spec.tensors {
        let Some(actual) = specs.iter().find(|s| s.name == tensor.name) else {
            return Err(ParamsError::UnknownTensor(tensor.name.clone()));
        };
        if actual.shape != tensor.shape {
            return Err(ParamsError::ShapeMismatch {
                name: tensor.name.clone(),
                expected: tensor.shape.clone(),
                actual: actual.shape.clone(),
            });
        }
    }
    Ok(())
}

/// `model` with every float parameter's values replaced by those of `from` (same shapes),
/// each kept on `model`'s device: moves weights across backends through plain `f32`s.
pub fn copy_params(from: &Lm, model: Lm) -> Result<Lm, ParamsError> {
    let specs = tensor_specs(from);
    let wanted = specs.iter().map(|t| (t.name.as_str(), t)).collect();
    let values = read_named(from, &wanted)?;
    let values = values.iter().map(|(name, v)| (name.as_str(), v.as_slice())).collect();
    Ok(model.map(&mut Writer { path: Path::default(), values }))
}

/// Writes `flat` (laid out as [`read_fragment`] returns it) into fragment `spec` of `model`.
///
/// Everything is checked before the model is touched, so on error the model is unchanged.
pub fn write_fragment(
    model: &mut Lm,
    spec: &FragmentSpec,
    flat: &[f32],
) -> Result<(), ParamsError> {
    if flat.len() != spec.numel() {
        return Err(ParamsError::WrongLength {
            fragment: spec.id,
            expected: spec.numel(),
            actual: flat.len(),
        });
    }
    check_fragment(model, spec)?;
    let values = spec.ranges().map(|(t, range)| (t.name.as_str(), &flat[range])).collect();
    let mut writer = Writer { path: Path::default(), values };
    // `Module::map` consumes the model; swap a clone through it (clones share tensor storage).
    *model = model.clone().map(&mut writer);
    Ok(())
}

/// Swaps the named parameters' values in, keeping each parameter's id, device and
/// gradient setting.
struct Writer<'a> {
    path: Path,
    values: BTreeMap<&'a str, &'a [f32]>,
}
impl ModuleMapper for Writer<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(values) = self.values.get(self.path.name().as_str()).copied() else {
            return param;
        };
        let shape = param.lazy_shape().to_vec();
        param.map(|old| {
            let grad = old.is_require_grad();
            let new =
                Tensor::<D>::from_data(TensorData::new(values.to_vec(), shape), &old.device());
            if grad {
                new.require_grad()
            } else {
                new
            }
        })
    }
}
