/// An error building a tokenizer or chat template, or rendering a template.
///
/// Errors about the GGUF metadata carry the [`lucebox_gguf::Error`] that names the key and the
/// byte offset of its entry; template errors name the template.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct Error {
    #[source]
    kind: ErrorKind,
}

/// What went wrong. New kinds may be added in later versions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A tokenizer key is missing, has the wrong type, or holds a value that cannot be used.
    #[error("tokenizer metadata: {0}")]
    Metadata(lucebox_gguf::Error),
    /// The file asks for a tokenizer model or pre-tokenizer that is not implemented.
    #[error("unsupported tokenizer: {0}")]
    Unsupported(lucebox_gguf::Error),
    /// The template does not compile.
    #[error("chat template {template}: syntax error: {message}")]
    TemplateSyntax {
        /// The template's name (its metadata key for templates read from GGUF).
        template: String,
        /// What the template engine reported, with the line.
        message: String,
    },
    /// Rendering failed: an undefined operation, a type error, a bad filter argument.
    #[error("chat template {template}: rendering failed: {message}")]
    TemplateRender {
        /// The template's name.
        template: String,
        /// What the template engine reported, with the line.
        message: String,
    },
    /// The template called `raise_exception`, usually to reject the conversation it was given.
    #[error("chat template {template} rejected the conversation: {message}")]
    TemplateRaised {
        /// The template's name.
        template: String,
        /// The message the template raised.
        message: String,
    },
    /// Rendering took more steps than the fuel allows: the template loops too long.
    #[error("chat template {template}: ran out of fuel ({fuel} steps)")]
    TemplateOutOfFuel {
        /// The template's name.
        template: String,
        /// The fuel the render was given.
        fuel: u64,
    },
    /// The rendered text grew past the output limit.
    #[error("chat template {template}: output exceeds {limit} bytes")]
    TemplateOutputTooLarge {
        /// The template's name.
        template: String,
        /// The output limit in bytes.
        limit: usize,
    },
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Self { kind }
    }
}

impl From<lucebox_gguf::Error> for Error {
    fn from(error: lucebox_gguf::Error) -> Self {
        ErrorKind::Metadata(error).into()
    }
}
