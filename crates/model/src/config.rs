use lucebox_backend::{AttentionShape, Rope, RopeStyle};
use lucebox_gguf::{GgufFile, Metadata};

use crate::Error;

/// The most positions a model may declare; larger values are treated as malformed.
const MAX_CONTEXT: u64 = 1 << 24;
/// The largest width (embedding, feed-forward, head) accepted from metadata.
const MAX_WIDTH: u64 = 1 << 20;

/// The architectures this crate builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama` (also SmolLM2): adjacent-pair RoPE on converter-permuted Q/K.
    Llama,
    /// `qwen2`: biases on Q, K and V; NeoX RoPE.
    Qwen2,
    /// `qwen3`: RMSNorm on each Q and K head before RoPE; NeoX RoPE.
    Qwen3,
}

impl Architecture {
    fn from_name(name: &str) -> Result<Self, Error> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            other => Err(Error::UnsupportedArchitecture(other.to_owned())),
        }
    }

    /// The name used in GGUF metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    fn rope_style(self) -> RopeStyle {
        match self {
            Self::Llama => RopeStyle::Adjacent,
            Self::Qwen2 | Self::Qwen3 => RopeStyle::Neox,
        }
    }
}

/// A model's hyperparameters, read from GGUF metadata and the shapes of its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub architecture: Architecture,
    /// Transformer blocks.
    pub layers: usize,
    /// Width of the residual stream.
    pub embedding: usize,
    /// Width of the feed-forward hidden layer.
    pub feed_forward: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding table).
    pub vocab: usize,
    /// Positions the model was trained for.
    pub context_length: usize,
    /// The epsilon of every RMSNorm.
    pub rms_eps: f32,
    /// The rotary embedding.
    pub rope: Rope,
}

impl ModelConfig {
    /// Reads the configuration of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, Error> {
        let m = file.metadata();
        let architecture = Architecture::from_name(m.str("general.architecture")?)?;
        let arch = architecture.name();
        let key = |k: &str| format!("{arch}.{k}");
        let layers = bounded(m, &key("block_count"), 1, lucebox_gguf::MAX_BLOCK_COUNT)?;
        let embedding = bounded(m, &key("embedding_length"), 1, MAX_WIDTH)?;
        let feed_forward = bounded(m, &key("feed_forward_length"), 1, MAX_WIDTH)?;
        let heads = bounded(m, &key("attention.head_count"), 1, MAX_WIDTH)?;
        let kv_heads = match m.opt_uint(&key("attention.head_count_kv"))? {
            None => heads,
            Some(_) => bounded(m, &key("attention.head_count_kv"), 1, heads as u64)?,
        };
        if heads % kv_heads != 0 {
            return Err(m
                .invalid(
                    &key("attention.head_count_kv"),
                    format!("{kv_heads} does not divide the {heads} query heads"),
                )
                .into());
        }
        let head_dim = match m.opt_uint(&key("attention.key_length"))? {
            Some(_) => bounded(m, &key("attention.key_length"), 2, MAX_WIDTH)?,
            None if embedding % heads == 0 => embedding / heads,
            None => {
                return Err(m
                    .invalid(
                        &key("embedding_length"),
                        format!("{embedding} is not a multiple of {heads} heads"),
                    )
                    .into());
            }
        };
        if let Some(v) = m.opt_uint(&key("attention.value_length"))?
            && v != head_dim as u64
        {
            return Err(m
                .invalid(
                    &key("attention.value_length"),
                    format!("{v} differs from the key length {head_dim}"),
                )
                .into());
        }
        let context_length = bounded(m, &key("context_length"), 1, MAX_CONTEXT)?;
        let rms_eps = m.float(&key("attention.layer_norm_rms_epsilon"))?;
        if !(rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(m
                .invalid(
                    &key("attention.layer_norm_rms_epsilon"),
                    format!("{rms_eps} is not in (0, 1)"),
                )
                .into());
        }
        let rope = read_rope(m, architecture, head_dim)?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
        let vocab = match *embd.dims() {
            [e, v] if e == embedding as u64 => v as usize,
            _ => {
                return Err(Error::TensorShape {
                    name: "token_embd.weight".into(),
                    found: embd.dims().to_vec(),
                    expected: vec![embedding as u64, 0],
                });
            }
        };
        Ok(Self {
            architecture,
            layers,
            embedding,
            feed_forward,
            heads,
            kv_heads,
            head_dim,
            vocab,
            context_length,
            rms_eps: rms_eps as f32,
            rope,
        })
    }

    /// The geometry of attention.
    pub fn attention_shape(&self) -> AttentionShape {
        AttentionShape {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }

    /// Bytes of KV cache per position (all layers, K and V, f16).
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * 2 * self.layers * self.kv_heads * self.head_dim) as u64
    }
}

fn bounded(m: &Metadata, key: &str, min: u64, max: u64) -> Result<usize, Error> {
    let v = m.uint(key)?;
    if !(min..=max).contains(&v) {
        return Err(m
            .invalid(key, format!("{v} is not in {min}..={max}"))
            .into());
    }
    Ok(v as usize)
}

fn read_rope(m: &Metadata, architecture: Architecture, head_dim: usize) -> Result<Rope, Error> {
    let arch = architecture.name();
    let dims_key = format!("{arch}.rope.dimension_count");
    let rotary_dims = match m.opt_uint(&dims_key)? {
        None => head_dim,
        Some(_) => bounded(m, &dims_key, 2, head_dim as u64)?,
    };
    if rotary_dims % 2 != 0 {
        return Err(m.invalid(&dims_key, format!("{rotary_dims} is odd")).into());
    }
    let base_key = format!("{arch}.rope.freq_base");
    let freq_base = m.opt_float(&base_key)?.unwrap_or(10_000.0);
    if !(freq_base > 1.0 && freq_base.is_finite()) {
        return Err(m
            .invalid(
                &base_key,
                format!("{freq_base} is not a finite value above 1"),
            )
            .into());
    }
    let scaling_key = format!("{arch}.rope.scaling.type");
    let factor_key = format!("{arch}.rope.scaling.factor");
    let position_scale = match m.opt_str(&scaling_key)? {
        None | Some("none") => 1.0,
        Some("linear") => {
            let factor = m.float(&factor_key)?;
            if !(factor >= 1.0 && factor.is_finite()) {
                return Err(m
                    .invalid(
                        &factor_key,
                        format!("{factor} is not a finite value of at least 1"),
                    )
                    .into());
            }
            1.0 / factor
        }
        Some(other) => {
            return Err(m
                .invalid(
                    &scaling_key,
                    format!("RoPE scaling {other:?} is not supported (none, linear are)"),
                )
                .into());
        }
    };
    Ok(Rope {
        style: architecture.rope_style(),
        rotary_dims,
        freq_base,
        position_scale,
    })
}
