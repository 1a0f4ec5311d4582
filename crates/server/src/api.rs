//! The OpenAI request bodies this server takes, checked and turned into a generation.

use lucebox_engine::{MAX_TOP_LOGPROBS, SamplingParams};
use lucebox_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde::Deserialize;

use crate::error::ApiError;
use crate::worker::Request;

/// Most stop strings per request, and the longest one in bytes.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 256;

/// What a request asks for, checked against the model.
#[derive(Debug)]
pub(crate) struct Generation {
    pub request: Request,
    pub stream: bool,
    pub include_usage: bool,
}

/// What request checking needs to know of the model being served.
pub(crate) struct Model<'a> {
    pub tokenizer: &'a Tokenizer,
    pub template: Option<&'a ChatTemplate>,
    /// Positions of context: prompt and generation together.
    pub context: usize,
    /// The most tokens one request may ask for.
    pub max_tokens: usize,
}

/// Parameters shared by chat and text completions. Fields OpenAI defines that do not change
/// generation (`user`, `metadata`, ...) are accepted and ignored, as OpenAI's own SDKs send them.
#[derive(Debug, Default, Deserialize)]
struct Common {
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// vLLM's and llama.cpp's; 0 or negative keeps every token.
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    repetition_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    response_format: Option<ResponseFormat>,
    logprobs: Option<serde_json::Value>,
    top_logprobs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<Message>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

/// A `/v1/chat/completions` body.
pub(crate) fn chat(body: &[u8], model: &Model) -> Result<Generation, ApiError> {
    let request: ChatRequest = parse_json(body)?;
    if request.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let template = model
        .template
        .ok_or_else(|| ApiError::invalid("the model has no chat template: use /v1/completions"))?;
    let messages = request
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            let content = match message.content {
                None => String::new(),
                Some(Content::Text(text)) => text,
                Some(Content::Parts(parts)) => parts
                    .into_iter()
                    .map(|part| match (part.kind.as_str(), part.text) {
                        ("text", Some(text)) => Ok(text),
                        (kind, _) => Err(ApiError::invalid_param(
                            &format!("messages[{i}].content"),
                            format!("content parts of type {kind:?} are not supported: only text"),
                        )),
                    })
                    .collect::<Result<String, _>>()?,
            };
            Ok(ChatMessage::new(message.role, content))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid_param("messages", format!("chat template: {e}")))?;
    let prompt = model.tokenizer.encode_prompt(&text, true);
    let logprobs = chat_logprobs(&request.common)?;
    generation(prompt, request.common, logprobs, model)
}

/// Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20, only with `logprobs`).
fn chat_logprobs(common: &Common) -> Result<Option<usize>, ApiError> {
    let wanted = match &common.logprobs {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => false,
        Some(serde_json::Value::Bool(true)) => true,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                "logprobs must be true or false",
            ));
        }
    };
    match (wanted, common.top_logprobs) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS as u64 => Err(ApiError::invalid_param(
            "top_logprobs",
            format!("top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}"),
        )),
        (false, Some(n)) if n > 0 => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs requires logprobs: true",
        )),
        (false, _) => Ok(None),
        (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
    }
}

/// The completions API's `logprobs`: how many alternatives to report with each token.
fn completion_logprobs(common: &Common) -> Result<Option<usize>, ApiError> {
    match &common.logprobs {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Ok(Some(n as usize)),
            _ => Err(ApiError::invalid_param(
                "logprobs",
                format!("logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
            )),
        },
    }
}

/// A `/v1/completions` body.
pub(crate) fn completion(body: &[u8], model: &Model) -> Result<Generation, ApiError> {
    let request: CompletionRequest = parse_json(body)?;
    let one_prompt =
        || ApiError::invalid_param("prompt", "only one prompt per request is supported");
    let prompt = match request.prompt {
        Prompt::Text(text) => model.tokenizer.encode_prompt(&text, false),
        Prompt::Texts(texts) => match <[String; 1]>::try_from(texts) {
            Ok([text]) => model.tokenizer.encode_prompt(&text, false),
            Err(_) => return Err(one_prompt()),
        },
        Prompt::Tokens(tokens) => tokens,
        Prompt::TokenLists(lists) => match <[Vec<u32>; 1]>::try_from(lists) {
            Ok([tokens]) => tokens,
            Err(_) => return Err(one_prompt()),
        },
    };
    let vocab = model.tokenizer.vocab_size();
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("token id {bad} is not below the vocabulary size {vocab}"),
        ));
    }
    let logprobs = completion_logprobs(&request.common)?;
    generation(prompt, request.common, logprobs, model)
}

fn generation(
    prompt: Vec<u32>,
    common: Common,
    logprobs: Option<usize>,
    model: &Model,
) -> Result<Generation, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    if prompt.len() >= model.context {
        return Err(ApiError::invalid(format!(
            "the prompt does not fit the context: n_prompt_tokens = {}, n_ctx = {} (one position \
             must remain for the first generated token)",
            prompt.len(),
            model.context
        )));
    }
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
    }
    if let Some(format) = &common.response_format
        && format.kind != "text"
    {
        return Err(ApiError::invalid_param(
            "response_format",
            format!(
                "response_format {:?} is not supported: only \"text\"",
                format.kind
            ),
        ));
    }
    let room = model.context - prompt.len();
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None => room.min(model.max_tokens),
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        Some(n) if n > model.max_tokens as u64 => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "max_tokens {n} exceeds this server's limit of {}",
                    model.max_tokens
                ),
            ));
        }
        Some(n) => n as usize,
    };
    let stop = match common.stop {
        None => Vec::new(),
        Some(Stop::One(stop)) => vec![stop],
        Some(Stop::Many(stops)) => stops,
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid_param(
            "stop",
            format!("at most {MAX_STOPS} stop strings"),
        ));
    }
    if let Some(bad) = stop
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(ApiError::invalid_param(
            "stop",
            format!("stop string {bad:?} is not 1 to {MAX_STOP_BYTES} bytes long"),
        ));
    }
    let defaults = SamplingParams::default();
    let params = SamplingParams {
        // OpenAI's default temperature is 1.
        temperature: common.temperature.unwrap_or(1.0),
        top_k: common.top_k.map_or(0, |k| usize::try_from(k).unwrap_or(0)),
        top_p: common.top_p.unwrap_or(defaults.top_p),
        min_p: common.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: common
            .repetition_penalty
            .unwrap_or(defaults.repetition_penalty),
        presence_penalty: common.presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: common
            .frequency_penalty
            .unwrap_or(defaults.frequency_penalty),
        seed: common.seed,
        ..defaults
    };
    params.validate().map_err(|e| match e {
        lucebox_engine::Error::InvalidParameter { name, why } => {
            ApiError::invalid_param(name, format!("{name} {why}"))
        }
        other => ApiError::invalid(other.to_string()),
    })?;
    Ok(Generation {
        request: Request {
            prompt,
            params,
            max_tokens,
            stop,
            logprobs,
        },
        stream: common.stream.unwrap_or(false),
        include_usage: common
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields alone; the checks against a model run in the server's integration tests.
    fn parse_common(body: &str) -> Result<Common, serde_json::Error> {
        serde_json::from_str(body)
    }

    #[test]
    fn odd_values_are_errors_not_panics() {
        for body in [
            r#"{"max_tokens": -1}"#,
            r#"{"max_tokens": 1e30}"#,
            r#"{"seed": -5}"#,
            r#"{"stop": 3}"#,
            r#"{"stop": [1, 2]}"#,
            r#"{"n": "two"}"#,
            r#"{"temperature": "hot"}"#,
        ] {
            assert!(parse_common(body).is_err(), "{body}");
        }
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(serde_json::from_str::<ChatRequest>(&deep).is_err());
        let huge = parse_common(r#"{"max_tokens": 18446744073709551615, "top_k": -3}"#).unwrap();
        assert_eq!(huge.max_tokens, Some(u64::MAX));
        assert_eq!(huge.top_k, Some(-3));
    }

    #[test]
    fn logprobs_follow_each_api_s_shape() {
        let chat = |body: &str| chat_logprobs(&parse_common(body).unwrap());
        assert_eq!(chat("{}").unwrap(), None);
        assert_eq!(chat(r#"{"logprobs": true}"#).unwrap(), Some(0));
        assert_eq!(
            chat(r#"{"logprobs": true, "top_logprobs": 5}"#).unwrap(),
            Some(5)
        );
        assert_eq!(
            chat(r#"{"logprobs": false, "top_logprobs": 0}"#).unwrap(),
            None
        );
        for bad in [
            r#"{"top_logprobs": 2}"#,
            r#"{"logprobs": true, "top_logprobs": 21}"#,
            r#"{"logprobs": 3}"#,
        ] {
            assert!(chat(bad).is_err(), "{bad}");
        }
        let text = |body: &str| completion_logprobs(&parse_common(body).unwrap());
        assert_eq!(text(r#"{"logprobs": 3}"#).unwrap(), Some(3));
        assert_eq!(text(r#"{"logprobs": null}"#).unwrap(), None);
        for bad in [
            r#"{"logprobs": true}"#,
            r#"{"logprobs": 21}"#,
            r#"{"logprobs": -1}"#,
        ] {
            assert!(text(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stop_strings_parse_as_one_or_many() {
        let one: Common = serde_json::from_str(r#"{"stop": " 3"}"#).unwrap();
        assert!(matches!(one.stop, Some(Stop::One(s)) if s == " 3"));
        let request: ChatRequest =
            serde_json::from_str(r#"{"messages": [], "stop": ["a", "b"], "max_tokens": 3}"#)
                .unwrap();
        assert!(matches!(request.common.stop, Some(Stop::Many(s)) if s == ["a", "b"]));
        assert_eq!(request.common.max_tokens, Some(3));
    }
}
