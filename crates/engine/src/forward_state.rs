//! What every holder of sequences (a session, the batcher, the drafter model) keeps to run
//! forward passes over a KV pool of its own.

use lucebox_backend::{Backend, BatchCapacity, KvLayout, RaggedBatch};
use lucebox_model::{Model, Workspace};

use crate::{BlockPool, Error};

/// A model's KV pool of `layout` on the device, its blocks' bookkeeping, the activations of
/// passes up to a capacity, and the batch of the next pass.
pub(crate) struct ForwardState<B: Backend> {
    layout: KvLayout,
    kv: B::KvCache,
    pub(crate) pool: BlockPool,
    pub(crate) workspace: Workspace<B>,
    pub(crate) batch: RaggedBatch,
}

impl<B: Backend> ForwardState<B> {
    /// The device KV cache that `pool` keeps the books of, for `model`, and a workspace for
    /// passes within `capacity`.
    pub(crate) fn new(
        model: &Model<B>,
        pool: BlockPool,
        capacity: BatchCapacity,
    ) -> Result<Self, Error> {
        let layout = model.kv_layout(pool.blocks(), pool.block_tokens());
        Ok(Self {
            layout,
            kv: model.backend().kv_cache(layout)?,
            pool,
            workspace: model.workspace(capacity)?,
            batch: RaggedBatch::new(),
        })
    }

    /// The forward pass of `model` (this state's) over the batch.
    pub(crate) fn forward(&mut self, model: &Model<B>) -> Result<(), Error> {
        Ok(model.forward(&self.batch, &mut self.kv, &self.layout, &mut self.workspace)?)
    }
}
