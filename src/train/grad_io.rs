//! Moving gradients out of and back into burn, flat, in the model's visiting order
//! (the data-parallel hook of [`super::Trainer::step_reduced`]).

use burn::module::{ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};

/// Where one parameter's gradient sits in the flat buffer.
pub struct Slot {
    id: ParamId,
    shape: Vec<usize>,
    offset: usize,
    len: usize,
    /// `None`: the parameter had no gradient (zeros in the buffer, nothing put back).
    device: Option<Device>,
}

pub struct Take<'a> {
    pub grads: &'a mut GradientsParams,
    pub flat: &'a mut Vec<f32>,
    pub layout: &'a mut Vec<Slot>,
}

impl ModuleVisitor for Take<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let shape = param.lazy_shape().to_vec();
        let len = shape.iter().product();
        let offset = self.flat.len();
        let grad = self.grads.remove::<D>(param.id);
        let device = grad.as_ref().map(Tensor::device);
        let values = grad.and_then(|g| g.into_data().try_to_vec::<f32>().ok());
        match values {
            Some(v) if v.len() == len => self.flat.extend_from_slice(&v),
            _ => self.flat.resize(self.flat.len() + len, 0.0),
        }
        self.layout.push(Slot { id: param.id, shape, offset, len, device });
    }
}

pub struct Put<'a> {
    pub grads: &'a mut GradientsParams,
    pub flat: &'a [f32],
    pub layout: &'a [Slot],
    pub at: usize,
}

impl ModuleVisitor for Put<'_> {
    fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<D>>) {
        let Some(slot) = self.layout.get(self.at) else { return };
        self.at += 1;
        let (Some(device), Some(values)) =
            (&slot.device, self.flat.get(slot.offset..slot.offset + slot.len))
        else {
            return;
        };
        let data = TensorData::new(values.to_vec(), slot.shape.clone());
        self.grads.register::<D>(slot.id, Tensor::<D>::from_data(data, device));
    }
}
