//! Compiling a [`KernelList`]'s kernels: each weight's stored shape is checked against the
//! description before the backend sees it, and each compiled kernel's widths after, so a file
//! that disagrees with its own configuration fails at load with the tensor's name.

use std::sync::Arc;

use anelm_ane::KernelRole;
use anelm_model::tensor_store::TensorStore;

use crate::arch::kernel_list::{KernelDesc, LayerKernels};
use crate::arch::tensor_names::TensorNames;
use crate::backend::{Backend, Kernel};
use crate::error::{EngineError, Result};
use crate::stored_matrix::StoredMatrix;

impl<R: Copy> KernelDesc<R> {
    /// Check the weights' shapes (each role's stored name from `name`), compile on `backend`,
    /// check the kernel's widths.
    pub fn compile_named(
        &self,
        backend: &dyn Backend,
        store: &Arc<dyn TensorStore>,
        name: &dyn Fn(R) -> Result<String>,
    ) -> Result<Box<dyn Kernel>> {
        for w in &self.weights {
            StoredMatrix::load(store, &name(w.tensor)?)?.expect_shape(w.rows, w.cols)?;
        }
        let kernel = backend.compile(&self.spec, store)?;
        let shape = kernel.shape();
        if shape.output != self.rows || shape.input != self.cols {
            return Err(EngineError::Config(format!(
                "the {} kernel ({:?}) is {}×{}, expected {}×{}",
                self.role, self.spec, shape.output, shape.input, self.rows, self.cols
            )));
        }
        Ok(kernel)
    }
}

impl KernelDesc {
    /// [`KernelDesc::compile_named`] with a decoder's tensor names.
    pub fn compile(
        &self,
        backend: &dyn Backend,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
    ) -> Result<Box<dyn Kernel>> {
        self.compile_named(backend, store, &|t| names.name(t))
    }
}

/// One layer's compiled kernels, taken by role as the architecture assembles its layer.
pub(crate) struct CompiledLayer {
    kernels: Vec<(KernelRole, Box<dyn Kernel>)>,
}

impl CompiledLayer {
    /// Compile every kernel of a decoder layer, in order.
    pub(crate) fn compile(
        layer: &LayerKernels,
        backend: &dyn Backend,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
    ) -> Result<Self> {
        Self::compile_named(layer, backend, store, &|t| names.name(t))
    }

    /// Compile every kernel of `layer`, in order, each role's stored name from `name`.
    pub(crate) fn compile_named<R: Copy>(
        layer: &LayerKernels<R>,
        backend: &dyn Backend,
        store: &Arc<dyn TensorStore>,
        name: &dyn Fn(R) -> Result<String>,
    ) -> Result<Self> {
        let kernels = layer
            .kernels
            .iter()
            .map(|k| Ok((k.role, k.compile_named(backend, store, name)?)))
            .collect::<Result<_>>()?;
        Ok(Self { kernels })
    }

    /// The kernel for `role`; an error when the layer's description has none (an architecture
    /// whose forward and description disagree).
    pub(crate) fn take(&mut self, role: KernelRole) -> Result<Box<dyn Kernel>> {
        let i = self.kernels.iter().position(|(r, _)| *r == role).ok_or_else(|| {
            EngineError::Config(format!(
                "the layer's kernel list has no {role} kernel: the architecture's description and forward disagree"
            ))
        })?;
        Ok(self.kernels.remove(i).1)
    }
}

impl crate::arch::kernel_list::KernelList {
    /// This list for the file in `store`: the LM head reads the token embedding when the file
    /// has no output tensor (tied embeddings).
    pub fn for_store(mut self, store: &Arc<dyn TensorStore>, names: &TensorNames) -> Result<Self> {
        if !store.contains(&names.name(crate::arch::tensor_names::Tensor::Output)?) {
            self.tie_lm_head(names)?;
        }
        Ok(self)
    }
}
