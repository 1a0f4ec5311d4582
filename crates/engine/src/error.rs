/// An error from the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] lucebox_model::Error),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] lucebox_backend::Error),
    /// A sampling or generation parameter is out of range.
    #[error("{name}: {why}")]
    InvalidParameter {
        /// The parameter.
        name: &'static str,
        /// Its value and the allowed range.
        why: String,
    },
    /// The sequence would not fit in the context.
    #[error("{tokens} tokens do not fit in the context of {context} positions")]
    ContextFull {
        /// Tokens the sequence would hold.
        tokens: usize,
        /// The context size.
        context: usize,
    },
}
