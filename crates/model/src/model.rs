use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lucebox_backend::{
    ActivationPrecision, ActivationUse, Backend, BatchCapacity, KvLayout, PassShape, Projection,
    RaggedBatch, Rows,
};
use lucebox_gguf::GgufFile;

use crate::{Architecture, Error, ModelConfig};

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    q: B::Matrix,
    k: B::Matrix,
    v: B::Matrix,
    q_bias: Option<B::Vector>,
    k_bias: Option<B::Vector>,
    v_bias: Option<B::Vector>,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    attn_output: B::Matrix,
    ffn_norm: B::Vector,
    ffn_gate: B::Matrix,
    ffn_up: B::Matrix,
    ffn_down: B::Matrix,
}

/// A transformer whose weights live on a backend. It holds no per-sequence state: the KV cache
/// and the activations of a forward pass are passed in, so one model serves any number of
/// sequences and a cache can be rolled back by its owner.
pub struct Model<B: Backend> {
    /// Unique among the models of this process, so that a backend's recording of a forward pass
    /// is never replayed with another model's weights.
    id: u64,
    backend: Arc<B>,
    config: ModelConfig,
    activation_precision: ActivationPrecision,
    token_embd: B::Matrix,
    layers: Vec<Layer<B>>,
    output_norm: B::Vector,
    /// `None` when the output projection is tied to the token embedding.
    output: Option<B::Matrix>,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("backend", &self.backend.describe())
            .field("activation_precision", &self.activation_precision)
            .finish()
    }
}

/// Checks a tensor's dims (ggml order) and loads it.
struct Loader<'a, B: Backend> {
    backend: &'a B,
    file: &'a Arc<GgufFile>,
    precision: ActivationPrecision,
}

impl<B: Backend> Loader<'_, B> {
    fn check(&self, name: &str, expected: &[usize]) -> Result<bool, Error> {
        let Some(view) = self.file.tensor(name) else {
            return Ok(false);
        };
        if view
            .dims()
            .iter()
            .map(|&d| d as usize)
            .ne(expected.iter().copied())
        {
            return Err(Error::TensorShape {
                name: name.to_owned(),
                found: view.dims().to_vec(),
                expected: expected.iter().map(|&d| d as u64).collect(),
            });
        }
        Ok(true)
    }

    /// A layer's projection, which prompt rows pass through.
    fn layer_matrix(&self, name: &str, inputs: usize, outputs: usize) -> Result<B::Matrix, Error> {
        self.load(name, inputs, outputs, true)?
            .ok_or_else(|| Error::MissingTensor(name.to_owned()))
    }

    /// The token embedding, whose rows are gathered (and which a tied output projection
    /// applies to logits rows only).
    fn matrix(&self, name: &str, inputs: usize, outputs: usize) -> Result<B::Matrix, Error> {
        self.opt_matrix(name, inputs, outputs)?
            .ok_or_else(|| Error::MissingTensor(name.to_owned()))
    }

    /// The output projection, applied to logits rows only.
    fn opt_matrix(
        &self,
        name: &str,
        inputs: usize,
        outputs: usize,
    ) -> Result<Option<B::Matrix>, Error> {
        self.load(name, inputs, outputs, false)
    }

    fn load(
        &self,
        name: &str,
        inputs: usize,
        outputs: usize,
        prompt_rows: bool,
    ) -> Result<Option<B::Matrix>, Error> {
        if !self.check(name, &[inputs, outputs])? {
            return Ok(None);
        }
        Ok(Some(self.backend.load_matrix(
            self.file,
            name,
            self.precision,
            prompt_rows,
        )?))
    }

    fn vector(&self, name: &str, len: usize) -> Result<B::Vector, Error> {
        self.opt_vector(name, len)?
            .ok_or_else(|| Error::MissingTensor(name.to_owned()))
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<B::Vector>, Error> {
        if !self.check(name, &[len])? {
            return Ok(None);
        }
        Ok(Some(self.backend.load_vector(self.file, name)?))
    }
}

impl<B: Backend> Model<B> {
    /// Builds the model of `file` on `backend`, checking every tensor's shape against the
    /// metadata; its matmuls quantize activations in [`ActivationPrecision::Split`].
    pub fn load(backend: Arc<B>, file: Arc<GgufFile>) -> Result<Self, Error> {
        Self::load_with_precision(backend, file, ActivationPrecision::Split)
    }

    /// As [`load`](Self::load), with every matmul quantizing its activations at `precision`:
    /// one precision for every batch, so that a sequence's logits never depend on its batch.
    pub fn load_with_precision(
        backend: Arc<B>,
        file: Arc<GgufFile>,
        precision: ActivationPrecision,
    ) -> Result<Self, Error> {
        let config = ModelConfig::from_gguf(&file)?;
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(file
                .metadata()
                .invalid(
                    "general.architecture",
                    "per-frequency RoPE factors (rope_freqs.weight) are not supported",
                )
                .into());
        }
        let c = &config;
        let l = Loader {
            backend: &*backend,
            file: &file,
            precision,
        };
        let q_width = c.heads * c.head_dim;
        let kv_width = c.kv_heads * c.head_dim;
        let layers = (0..c.layers)
            .map(|i| {
                let name = |t: &str| format!("blk.{i}.{t}");
                let qk_norm = c.architecture == Architecture::Qwen3;
                Ok(Layer {
                    attn_norm: l.vector(&name("attn_norm.weight"), c.embedding)?,
                    q: l.layer_matrix(&name("attn_q.weight"), c.embedding, q_width)?,
                    k: l.layer_matrix(&name("attn_k.weight"), c.embedding, kv_width)?,
                    v: l.layer_matrix(&name("attn_v.weight"), c.embedding, kv_width)?,
                    q_bias: l.opt_vector(&name("attn_q.bias"), q_width)?,
                    k_bias: l.opt_vector(&name("attn_k.bias"), kv_width)?,
                    v_bias: l.opt_vector(&name("attn_v.bias"), kv_width)?,
                    q_norm: if qk_norm {
                        Some(l.vector(&name("attn_q_norm.weight"), c.head_dim)?)
                    } else {
                        None
                    },
                    k_norm: if qk_norm {
                        Some(l.vector(&name("attn_k_norm.weight"), c.head_dim)?)
                    } else {
                        None
                    },
                    attn_output: l.layer_matrix(
                        &name("attn_output.weight"),
                        q_width,
                        c.embedding,
                    )?,
                    ffn_norm: l.vector(&name("ffn_norm.weight"), c.embedding)?,
                    ffn_gate: l.layer_matrix(
                        &name("ffn_gate.weight"),
                        c.embedding,
                        c.feed_forward,
                    )?,
                    ffn_up: l.layer_matrix(&name("ffn_up.weight"), c.embedding, c.feed_forward)?,
                    ffn_down: l.layer_matrix(
                        &name("ffn_down.weight"),
                        c.feed_forward,
                        c.embedding,
                    )?,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let token_embd = l.matrix("token_embd.weight", c.embedding, c.vocab)?;
        let output_norm = l.vector("output_norm.weight", c.embedding)?;
        let output = l.opt_matrix("output.weight", c.embedding, c.vocab)?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            config,
            activation_precision: precision,
            token_embd,
            layers,
            output_norm,
            output,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The precision its matmuls quantize activations at.
    pub fn activation_precision(&self) -> ActivationPrecision {
        self.activation_precision
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The KV layout for a pool of `blocks` blocks of `block_tokens` positions.
    pub fn kv_layout(&self, blocks: usize, block_tokens: usize) -> KvLayout {
        KvLayout {
            layers: self.config.layers,
            blocks,
            block_tokens,
            kv_heads: self.config.kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// Activation buffers for forward passes of up to `capacity`: the inputs of the layers'
    /// projections take prompt rows, the output head's input none (`enqueue`).
    pub fn workspace(&self, capacity: BatchCapacity) -> Result<Workspace<B>, Error> {
        const PLAIN: ActivationUse = ActivationUse::Plain;
        let matmul_input = |prompt_rows| ActivationUse::MatmulInput {
            prompt_rows,
            precision: self.activation_precision,
        };
        let (layer_input, head_input) = (matmul_input(true), matmul_input(false));
        let b = &*self.backend;
        let c = &self.config;
        let t = capacity.tokens;
        let logits_rows = capacity.logits;
        Ok(Workspace {
            buffers: Buffers {
                batch: b.batch(capacity, c.rope, c.attention_shape())?,
                x: b.activations(t, c.embedding, PLAIN)?,
                normed: b.activations(t, c.embedding, layer_input)?,
                sublayer: b.activations(t, c.embedding, PLAIN)?,
                q: b.activations(t, c.heads * c.head_dim, PLAIN)?,
                k: b.activations(t, c.kv_heads * c.head_dim, PLAIN)?,
                v: b.activations(t, c.kv_heads * c.head_dim, PLAIN)?,
                attn: b.activations(t, c.heads * c.head_dim, layer_input)?,
                gate: b.activations(t, c.feed_forward, layer_input)?,
                up: b.activations(t, c.feed_forward, PLAIN)?,
                selected: b.activations(logits_rows, c.embedding, head_input)?,
                logits: b.activations(logits_rows, c.vocab, PLAIN)?,
            },
            recordings: b.recordings(),
            logits_rows: 0,
            capacity,
        })
    }

    /// Runs one forward pass over `batch`, writing its tokens' K and V into `kv` (a pool of
    /// `kv_layout` shape) and leaving one logits row per [`RaggedBatch::logits_rows`] entry in
    /// the workspace.
    pub fn forward(
        &self,
        batch: &RaggedBatch,
        kv: &mut B::KvCache,
        kv_layout: &KvLayout,
        ws: &mut Workspace<B>,
    ) -> Result<(), Error> {
        let b = &*self.backend;
        let c = &self.config;
        batch.validate(
            c.vocab,
            kv_layout.block_tokens,
            kv_layout.blocks,
            c.context_length,
        )?;
        let variant = b.set_batch(&mut ws.buffers.batch, batch)?;
        let shape = PassShape {
            model: self.id,
            tokens: batch.len(),
            logits: batch.logits_rows().len(),
            prompt: batch.prompt_tokens(),
            variant,
        };
        let buffers = &mut ws.buffers;
        b.run_pass(&mut ws.recordings, shape, kv, |kv| {
            self.enqueue(shape, kv, buffers)
        })?;
        ws.logits_rows = shape.logits;
        Ok(())
    }

    /// Issues the operations of a forward pass over the batch in `ws.batch`.
    fn enqueue(
        &self,
        shape: PassShape,
        kv: &mut B::KvCache,
        ws: &mut Buffers<B>,
    ) -> Result<(), lucebox_backend::Error> {
        let b = &*self.backend;
        let c = &self.config;
        let n = shape.tokens;
        let rows = Rows {
            total: n,
            prompt: shape.prompt,
        };
        let eps = c.rms_eps;
        let attention = c.attention_shape();
        // The logits rows are a subset of the tokens in batch order, so as many are all of them.
        let every_row_scored = shape.logits == n && !self.layers.is_empty();
        b.embed(&self.token_embd, &ws.batch, &mut ws.x)?;
        if let Some(first) = self.layers.first() {
            b.rms_norm(&ws.x, &first.attn_norm, eps, n, &mut ws.normed)?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            b.matmuls(
                &ws.normed,
                rows,
                &mut [
                    Projection {
                        matrix: &layer.q,
                        bias: layer.q_bias.as_ref(),
                        out: &mut ws.q,
                    },
                    Projection {
                        matrix: &layer.k,
                        bias: layer.k_bias.as_ref(),
                        out: &mut ws.k,
                    },
                    Projection {
                        matrix: &layer.v,
                        bias: layer.v_bias.as_ref(),
                        out: &mut ws.v,
                    },
                ],
            )?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                b.rms_norm_heads(&mut ws.q, qn, eps, n)?;
                b.rms_norm_heads(&mut ws.k, kn, eps, n)?;
            }
            b.attend(
                &mut ws.q,
                &mut ws.k,
                &ws.v,
                kv,
                i,
                &ws.batch,
                attention,
                &mut ws.attn,
            )?;
            b.matmul(&layer.attn_output, None, &ws.attn, rows, &mut ws.sublayer)?;
            b.add_rms_norm(
                &mut ws.x,
                &ws.sublayer,
                &layer.ffn_norm,
                eps,
                n,
                &mut ws.normed,
            )?;
            b.matmuls(
                &ws.normed,
                rows,
                &mut [
                    Projection {
                        matrix: &layer.ffn_gate,
                        bias: None,
                        out: &mut ws.gate,
                    },
                    Projection {
                        matrix: &layer.ffn_up,
                        bias: None,
                        out: &mut ws.up,
                    },
                ],
            )?;
            b.silu_mul(&mut ws.gate, &ws.up, n)?;
            b.matmul(&layer.ffn_down, None, &ws.gate, rows, &mut ws.sublayer)?;
            // The residual add ends the layer; the next layer's norm goes with it.
            match self.layers.get(i + 1) {
                Some(next) => b.add_rms_norm(
                    &mut ws.x,
                    &ws.sublayer,
                    &next.attn_norm,
                    eps,
                    n,
                    &mut ws.normed,
                )?,
                // Where every row wants logits (decode and verify steps), the output norm
                // goes with it too, and no row needs gathering.
                None if every_row_scored => b.add_rms_norm(
                    &mut ws.x,
                    &ws.sublayer,
                    &self.output_norm,
                    eps,
                    n,
                    &mut ws.selected,
                )?,
                None => b.add(&mut ws.x, &ws.sublayer, n)?,
            }
        }
        let logits = shape.logits;
        if !every_row_scored {
            b.gather_logits_rows(&ws.x, &ws.batch, &mut ws.normed)?;
            b.rms_norm(&ws.normed, &self.output_norm, eps, logits, &mut ws.selected)?;
        }
        b.matmul(
            self.output.as_ref().unwrap_or(&self.token_embd),
            None,
            &ws.selected,
            Rows::generated(logits),
            &mut ws.logits,
        )?;
        Ok(())
    }
}

/// The activation buffers of forward passes up to a fixed capacity, allocated once and reused
/// by every pass so that decoding does not allocate, with the backend's recordings of the
/// passes that ran on them.
pub struct Workspace<B: Backend> {
    buffers: Buffers<B>,
    recordings: B::Recordings,
    logits_rows: usize,
    capacity: BatchCapacity,
}

/// The device buffers of a workspace.
struct Buffers<B: Backend> {
    batch: B::Batch,
    x: B::Activations,
    normed: B::Activations,
    /// A sublayer's output (attention's or the feed-forward's), before the residual add.
    sublayer: B::Activations,
    q: B::Activations,
    k: B::Activations,
    v: B::Activations,
    attn: B::Activations,
    gate: B::Activations,
    up: B::Activations,
    selected: B::Activations,
    logits: B::Activations,
}

impl<B: Backend> std::fmt::Debug for Workspace<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("capacity", &self.capacity)
            .field("logits_rows", &self.logits_rows)
            .finish()
    }
}

impl<B: Backend> Workspace<B> {
    /// The logits of the last forward pass: one row per wanted token, in batch order.
    pub fn logits(&self) -> &B::Activations {
        &self.buffers.logits
    }

    /// The logits, for operations that change them where they are (a device's sampling applies
    /// the penalties in place).
    pub fn logits_mut(&mut self) -> &mut B::Activations {
        &mut self.buffers.logits
    }

    /// How many logits rows the last forward pass produced.
    pub fn logits_rows(&self) -> usize {
        self.logits_rows
    }

    /// The capacity the workspace was built for.
    pub fn capacity(&self) -> BatchCapacity {
        self.capacity
    }
}
