//! Chat template rendering: Hugging Face's environment, and limits on hostile templates.

use std::time::{Duration, Instant};

use lucebox_tokenizer::{ChatMessage, ChatTemplate, ErrorKind, TemplateLimits};

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(
        "test.jinja",
        source,
        Some("<s>".into()),
        Some("</s>".into()),
    )
    .expect("template compiles")
}

fn render(source: &str, messages: &[ChatMessage]) -> String {
    template(source).render(messages, true).expect("renders")
}

fn user(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", content)]
}

#[test]
fn renders_with_hugging_face_variables_and_whitespace_rules() {
    let source = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.role }}] {{ m.content }}\n    {% endif %}\n{% endfor %}\n{% if tools %}TOOLS{% endif %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}";
    assert_eq!(render(source, &user("hi")), "<s>\n[user] hi\n></s>");
    let without = template("{% if add_generation_prompt %}>{% endif %}")
        .render(&user("x"), false)
        .expect("renders");
    assert_eq!(without, "");
}

#[test]
fn python_methods_and_tojson() {
    let messages = vec![ChatMessage::new("user", "  hé \"x\"\n")];
    assert_eq!(
        render("{{ messages[0].content.strip() }}", &messages),
        "hé \"x\""
    );
    assert_eq!(render("{{ 'a,b'.split(',') | join('|') }}", &[]), "a|b");
    assert_eq!(render("{{ messages[0].role.upper() }}", &messages), "USER");
    assert_eq!(
        render("{{ messages | tojson }}", &messages),
        r#"[{"role": "user", "content": "  hé \"x\"\n"}]"#
    );
    assert_eq!(
        render(
            "{{ {'b': 1, 'a': [1.5, true, none, 1e20]} | tojson(indent=2, sort_keys=true) }}",
            &[]
        ),
        "{\n  \"a\": [\n    1.5,\n    true,\n    null,\n    1e+20\n  ],\n  \"b\": 1\n}"
    );
    assert_eq!(
        render("{{ {'k': []} | tojson(separators=(',', ':')) }}", &[]),
        r#"{"k":[]}"#
    );
    assert_eq!(
        render("{{ 'é' | tojson(ensure_ascii=true) }}", &[]),
        r#""\u00e9""#
    );
}

#[test]
fn strftime_now_formats_the_local_time() {
    let year = render("{{ strftime_now('%Y') }}", &[]);
    assert!(
        year.len() == 4 && year.bytes().all(|b| b.is_ascii_digit()),
        "{year}"
    );
    let error = template("{{ strftime_now('%Q%') }}")
        .render(&[], true)
        .expect_err("bad format");
    assert!(
        matches!(error.kind(), ErrorKind::TemplateRender { .. }),
        "{error}"
    );
}

#[test]
fn raise_exception_rejects_the_conversation() {
    let t = template(
        "{% if messages[0].role != 'system' %}{{ raise_exception('System role first') }}{% endif %}ok",
    );
    let error = t.render(&user("hi"), true).expect_err("raises");
    match error.kind() {
        ErrorKind::TemplateRaised { template, message } => {
            assert_eq!(template, "test.jinja");
            assert_eq!(message, "System role first");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(
        t.render(&[ChatMessage::new("system", "s")], true)
            .expect("renders"),
        "ok"
    );
}

#[test]
fn syntax_and_render_errors_name_the_template() {
    let error = ChatTemplate::new("broken.jinja", "{% for %}", None, None).expect_err("bad syntax");
    assert!(matches!(error.kind(), ErrorKind::TemplateSyntax { .. }));
    assert!(error.to_string().contains("broken.jinja"), "{error}");
    let error = template("{{ [1] + 'a' }}")
        .render(&[], true)
        .expect_err("type error");
    assert!(matches!(error.kind(), ErrorKind::TemplateRender { .. }));
    assert!(error.to_string().contains("test.jinja"), "{error}");
}

#[test]
fn looping_template_runs_out_of_fuel() {
    let t = template(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    )
    .with_limits(TemplateLimits {
        fuel: 1_000_000,
        max_output_bytes: usize::MAX,
    });
    let start = Instant::now();
    let error = t.render(&[], true).expect_err("out of fuel");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::TemplateOutOfFuel {
                fuel: 1_000_000,
                ..
            }
        ),
        "{error}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    // The default fuel also stops it.
    let error = template(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    )
    .render(&[], true)
    .expect_err("out of fuel");
    assert!(
        matches!(error.kind(), ErrorKind::TemplateOutOfFuel { .. }),
        "{error}"
    );
}

#[test]
fn unbounded_recursion_is_an_error() {
    let error = template("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
        .render(&[], true)
        .expect_err("recursion");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::TemplateRender { .. } | ErrorKind::TemplateOutOfFuel { .. }
        ),
        "{error}"
    );
}

#[test]
fn output_is_capped() {
    let t = template("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}").with_limits(
        TemplateLimits {
            fuel: 1_000_000,
            max_output_bytes: 10_000,
        },
    );
    let error = t.render(&[], true).expect_err("too large");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::TemplateOutputTooLarge { limit: 10_000, .. }
        ),
        "{error}"
    );
    let small = template("{{ 'x' * 10 }}").with_limits(TemplateLimits {
        fuel: 1_000,
        max_output_bytes: 10,
    });
    assert_eq!(small.render(&[], true).expect("fits exactly"), "xxxxxxxxxx");
}
