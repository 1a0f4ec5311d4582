//! Chat templates: the Jinja template a model file carries, rendered the way Hugging Face's
//! `apply_chat_template` renders it, with limits a hostile template cannot get past.

mod pyjson;

use std::fmt::Write as _;
use std::io;

use lucebox_gguf::Metadata;
use minijinja::{Environment, Value, context};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind};
use crate::vocab::KEY_TOKENS;

const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// One message of a conversation, as the template sees it (`message.role`, `message.content`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The limits one render runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Template engine steps allowed; a render that needs more fails with
    /// [`ErrorKind::TemplateOutOfFuel`].
    pub fuel: u64,
    /// The longest output in bytes; a longer one fails with
    /// [`ErrorKind::TemplateOutputTooLarge`].
    pub max_output_bytes: usize,
}

impl Default for TemplateLimits {
    /// Room for conversations thousands of messages long (about a hundred steps each in common
    /// templates) while a runaway loop stops within a second.
    fn default() -> Self {
        Self {
            fuel: 10_000_000,
            max_output_bytes: 16 << 20,
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    name: String,
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    limits: TemplateLimits,
}

impl ChatTemplate {
    /// The file's `tokenizer.chat_template`, if it has one, with `bos_token` and `eos_token`
    /// taken from its vocabulary.
    pub fn from_gguf(meta: &Metadata) -> Result<Option<Self>, Error> {
        let Some(source) = meta.opt_str(KEY_CHAT_TEMPLATE)? else {
            return Ok(None);
        };
        let tokens = meta.str_array(KEY_TOKENS)?;
        let token = |name: &str| -> Result<Option<String>, Error> {
            let key = format!("tokenizer.ggml.{name}_token_id");
            Ok(meta
                .opt_uint(&key)?
                .and_then(|id| usize::try_from(id).ok())
                .and_then(|id| tokens.get(id))
                .cloned())
        };
        let (bos, eos) = (token("bos")?, token("eos")?);
        Self::new(KEY_CHAT_TEMPLATE, source, bos, eos).map(Some)
    }

    /// Compiles `source`; `name` appears in errors. `bos_token` and `eos_token` are the
    /// variables of those names (undefined when `None`).
    pub fn new(
        name: &str,
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, Error> {
        let limits = TemplateLimits::default();
        let mut env = Environment::new();
        // Hugging Face's environment: blocks swallow the newline after them and the indentation
        // before them, and Python's string and dict methods are available.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(limits.fuel));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", pyjson::tojson);
        env.add_template_owned(name.to_string(), source.to_string())
            .map_err(|e| ErrorKind::TemplateSyntax {
                template: name.to_string(),
                message: describe(&e),
            })?;
        Ok(Self {
            name: name.to_string(),
            env,
            bos_token,
            eos_token,
            limits,
        })
    }

    /// The same template under other limits.
    pub fn with_limits(mut self, limits: TemplateLimits) -> Self {
        self.env.set_fuel(Some(limits.fuel));
        self.limits = limits;
        self
    }

    /// The template's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renders `messages`, ending with the assistant's header when `add_generation_prompt`.
    /// `tools` is left undefined.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let template = self
            .env
            .get_template(&self.name)
            .map_err(|e| self.render_error(&e))?;
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref().map(Value::from).unwrap_or(Value::UNDEFINED),
            eos_token => self.eos_token.as_deref().map(Value::from).unwrap_or(Value::UNDEFINED),
        };
        let mut output = CappedOutput {
            bytes: Vec::new(),
            limit: self.limits.max_output_bytes,
            overflowed: false,
        };
        let result = template.render_captured_to(ctx, &mut output);
        if output.overflowed {
            return Err(ErrorKind::TemplateOutputTooLarge {
                template: self.name.clone(),
                limit: self.limits.max_output_bytes,
            }
            .into());
        }
        result.map_err(|e| self.render_error(&e))?;
        // The engine writes only whole strings it rendered, so the bytes are UTF-8.
        Ok(String::from_utf8_lossy(&output.bytes).into_owned())
    }

    fn render_error(&self, error: &minijinja::Error) -> Error {
        let template = self.name.clone();
        match error.kind() {
            minijinja::ErrorKind::OutOfFuel => ErrorKind::TemplateOutOfFuel {
                template,
                fuel: self.limits.fuel,
            },
            _ if error.detail().is_some_and(|d| d.starts_with(RAISED_PREFIX)) => {
                ErrorKind::TemplateRaised {
                    template,
                    message: error
                        .detail()
                        .unwrap_or_default()
                        .trim_start_matches(RAISED_PREFIX)
                        .to_string(),
                }
            }
            _ => ErrorKind::TemplateRender {
                template,
                message: describe(error),
            },
        }
        .into()
    }
}

/// Marks errors raised by the template itself, to tell them from the engine's.
const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

/// Python's `datetime.now().strftime(format)`, in local time.
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {format:?}"),
        )
    })?;
    Ok(out)
}

/// The engine's message with the line it concerns.
fn describe(error: &minijinja::Error) -> String {
    let what = error
        .detail()
        .map_or_else(|| error.kind().to_string(), str::to_string);
    match error.line() {
        Some(line) => format!("{what} (line {line})"),
        None => what,
    }
}

/// Collects the output and refuses to grow past `limit`, which stops the render.
struct CappedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for &mut CappedOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("chat template output limit reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
