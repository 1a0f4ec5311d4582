//! What every backend checks before an operation touches memory: that the operands' shapes fit
//! together and every index a kernel will follow stays inside its buffer. One function per
//! [`Backend`](crate::Backend) operation, on plain sizes, so that all backends refuse exactly the
//! same calls with the same messages.

use lucebox_gguf::{GgufFile, TensorView};

use crate::batch::check_kv_positions;
use crate::{AttentionShape, BatchCapacity, Error, KvLayout, RaggedBatch, Rows};

/// An activation buffer's shape: rows of capacity, and columns.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// The tensor `name` of `file`, which must exist and have `N` dims (ggml order).
pub(crate) fn tensor<'a, const N: usize>(
    op: &'static str,
    file: &'a GgufFile,
    name: &str,
) -> Result<(TensorView<'a>, [usize; N]), Error> {
    let view = file.tensor(name).ok_or_else(|| Error::Shape {
        op,
        detail: format!("tensor {name} is missing"),
    })?;
    let dims: [u64; N] = view.dims().try_into().map_err(|_| Error::Shape {
        op,
        detail: format!("tensor {name} has dims {:?}, expected {N}", view.dims()),
    })?;
    Ok((view, dims.map(|d| d as usize)))
}

/// Fails unless `rows` fit in a buffer of `capacity` rows.
pub(crate) fn rows(op: &'static str, rows: usize, capacity: usize) -> Result<(), Error> {
    if rows > capacity {
        return Err(Error::Shape {
            op,
            detail: format!("{rows} rows exceed the capacity of {capacity}"),
        });
    }
    Ok(())
}

/// Fails unless `name` has `want` columns.
pub(crate) fn cols(op: &'static str, name: &str, got: usize, want: usize) -> Result<(), Error> {
    if got != want {
        return Err(Error::Shape {
            op,
            detail: format!("{name} has {got} columns, expected {want}"),
        });
    }
    Ok(())
}

pub(crate) fn set_batch(src: &RaggedBatch, cap: BatchCapacity) -> Result<(), Error> {
    if src.len() > cap.tokens
        || src.sequences() > cap.sequences
        || src.block_ids.len() > cap.blocks
        || src.logits_rows().len() > cap.logits
    {
        return Err(Error::Batch(format!(
            "{} tokens, {} sequences, {} blocks, {} logits rows exceed the capacity {cap:?}",
            src.len(),
            src.sequences(),
            src.block_ids.len(),
            src.logits_rows().len(),
        )));
    }
    if let Some(&seq) = src
        .token_seqs()
        .iter()
        .find(|&&s| s as usize >= src.sequences())
    {
        return Err(Error::Batch(format!("sequence {seq} was not added")));
    }
    Ok(())
}

/// `table` is (rows, cols) of the embedding matrix.
pub(crate) fn embed(batch: &RaggedBatch, table: (usize, usize), out: Dims) -> Result<(), Error> {
    let tokens = batch.tokens();
    rows("embed", tokens.len(), out.rows)?;
    cols("embed", "output", out.cols, table.1)?;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.0) {
        return Err(Error::Batch(format!(
            "token {t} is not below the vocabulary size {}",
            table.0
        )));
    }
    Ok(())
}

pub(crate) fn rms_norm(n: usize, x: Dims, weight: usize, out: Dims) -> Result<(), Error> {
    rows("rms_norm", n, x.rows)?;
    rows("rms_norm", n, out.rows)?;
    cols("rms_norm", "input", x.cols, weight)?;
    cols("rms_norm", "output", out.cols, weight)
}

pub(crate) fn rms_norm_heads(n: usize, x: Dims, head_dim: usize) -> Result<(), Error> {
    rows("rms_norm_heads", n, x.rows)?;
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) {
        return Err(Error::Shape {
            op: "rms_norm_heads",
            detail: format!("{} columns do not split into heads of {head_dim}", x.cols),
        });
    }
    Ok(())
}

/// `matrix` is (rows, cols) of the weights.
pub(crate) fn matmul(
    n: Rows,
    matrix: (usize, usize),
    bias: Option<usize>,
    x: Dims,
    out: Dims,
) -> Result<(), Error> {
    if n.prompt > n.total {
        return Err(Error::Shape {
            op: "matmul",
            detail: format!("{} prompt rows of {} rows", n.prompt, n.total),
        });
    }
    rows("matmul", n.total, x.rows)?;
    rows("matmul", n.total, out.rows)?;
    cols("matmul", "input", x.cols, matrix.1)?;
    cols("matmul", "output", out.cols, matrix.0)?;
    if let Some(len) = bias {
        cols("matmul", "bias", len, matrix.0)?;
    }
    Ok(())
}

pub(crate) fn rope(
    batch: &RaggedBatch,
    x: Dims,
    head_dim: usize,
    rotary_dims: usize,
) -> Result<(), Error> {
    rows("rope", batch.len(), x.rows)?;
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) || rotary_dims > head_dim {
        return Err(Error::Shape {
            op: "rope",
            detail: format!(
                "{} columns, heads of {head_dim}, {rotary_dims} rotary dims",
                x.cols
            ),
        });
    }
    Ok(())
}

pub(crate) fn store_kv(
    layout: &KvLayout,
    layer: usize,
    batch: &RaggedBatch,
    k: Dims,
    v: Dims,
) -> Result<(), Error> {
    let width = layout.kv_heads * layout.head_dim;
    rows("store_kv", batch.len(), k.rows)?;
    rows("store_kv", batch.len(), v.rows)?;
    cols("store_kv", "k", k.cols, width)?;
    cols("store_kv", "v", v.cols, width)?;
    if layer >= layout.layers {
        return Err(Error::Shape {
            op: "store_kv",
            detail: format!("layer {layer} of {}", layout.layers),
        });
    }
    check_kv_positions(batch, layout)
}

/// The head lengths a backend's attention kernel takes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadDims {
    /// The longest.
    pub(crate) max: usize,
    /// What every length is a multiple of.
    pub(crate) multiple_of: usize,
}

/// `head_dims` limits the heads the backend's kernel takes, if it has limits.
pub(crate) fn attention(
    layout: &KvLayout,
    layer: usize,
    batch: &RaggedBatch,
    shape: AttentionShape,
    head_dims: Option<HeadDims>,
    q: Dims,
    out: Dims,
) -> Result<(), Error> {
    rows("attention", batch.len(), q.rows)?;
    rows("attention", batch.len(), out.rows)?;
    cols("attention", "q", q.cols, shape.heads * shape.head_dim)?;
    cols(
        "attention",
        "output",
        out.cols,
        shape.heads * shape.head_dim,
    )?;
    let unsupported = head_dims.is_some_and(|limit| {
        shape.head_dim > limit.max || !shape.head_dim.is_multiple_of(limit.multiple_of)
    });
    if shape.kv_heads != layout.kv_heads
        || shape.head_dim != layout.head_dim
        || unsupported
        || !shape.heads.is_multiple_of(shape.kv_heads)
        || layer >= layout.layers
    {
        let limit = head_dims
            .map(|l| {
                format!(
                    " (this backend takes heads of at most {} dimensions, a multiple of {})",
                    l.max, l.multiple_of
                )
            })
            .unwrap_or_default();
        return Err(Error::Shape {
            op: "attention",
            detail: format!("{shape:?} against the cache {layout:?}, layer {layer}{limit}"),
        });
    }
    check_kv_positions(batch, layout)
}

/// The row-wise binary operations (`silu_mul`, `add`): `y` shaped as `x`.
pub(crate) fn elementwise(op: &'static str, n: usize, x: Dims, y: Dims) -> Result<(), Error> {
    rows(op, n, x.rows)?;
    rows(op, n, y.rows)?;
    cols(op, "second operand", y.cols, x.cols)
}

pub(crate) fn gather_logits_rows(batch: &RaggedBatch, x: Dims, out: Dims) -> Result<(), Error> {
    let wanted = batch.logits_rows();
    rows("gather_logits_rows", wanted.len(), out.rows)?;
    rows("gather_logits_rows", batch.len(), x.rows)?;
    cols("gather_logits_rows", "output", out.cols, x.cols)?;
    if let Some(&row) = wanted.iter().find(|&&r| r as usize >= batch.len()) {
        return Err(Error::Batch(format!(
            "logits row {row} is not a token of the batch"
        )));
    }
    Ok(())
}

pub(crate) fn read_rows(n: usize, x: Dims, out: usize) -> Result<(), Error> {
    rows("read_rows", n, x.rows)?;
    if out != n * x.cols {
        return Err(Error::Shape {
            op: "read_rows",
            detail: format!("{out} values for {n} rows of {}", x.cols),
        });
    }
    Ok(())
}
