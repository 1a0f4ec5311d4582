//! What a speculative verify pass costs: the time of one forward pass over n tokens of one
//! sequence, every row scored, against a plain one-token decode step, at a mid-length context.
//! Speculation pays only while verifying k + 1 tokens costs little more than one step. Each
//! activation precision is measured in turn, on one backend, each against its own plain step.
//!
//! ```sh
//! cargo run --release -p lucebox-engine --example verify-cost -- MODEL.gguf [THREADS]
//! ```

use std::sync::Arc;
use std::time::Instant;

use lucebox_backend::{ActivationPrecision, CpuBackend};
use lucebox_engine::{Session, SessionConfig};
use lucebox_gguf::GgufFile;
use lucebox_model::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: verify-cost MODEL.gguf [THREADS]")?;
    let threads = args.next().map(|t| t.parse()).transpose()?;
    let file = Arc::new(GgufFile::open(&path)?);
    let backend = Arc::new(CpuBackend::new(threads)?);
    for precision in [ActivationPrecision::Split, ActivationPrecision::Single] {
        let model = Model::load_with_precision(Arc::clone(&backend), Arc::clone(&file), precision)?;
        println!("{precision} activations");
        measure(Arc::new(model))?;
    }
    Ok(())
}

/// Prints the cost of passes of 1 to 9 tokens against the one-token pass.
fn measure(model: Arc<Model<CpuBackend>>) -> Result<(), Box<dyn std::error::Error>> {
    const CONTEXT: usize = 256;
    const LONGEST: usize = 9;
    const REPS: usize = 20;
    let mut session = Session::new(
        model,
        SessionConfig {
            context: CONTEXT + LONGEST,
            scored_tokens: LONGEST,
            ..SessionConfig::default()
        },
    )?;
    let prompt: Vec<u32> = (0..CONTEXT as u32).map(|i| 100 + i % 1000).collect();
    session.feed_prompt(&prompt)?;
    let mut plain = 0.0;
    println!("{:>7} {:>10} {:>14}", "tokens", "ms/pass", "x plain step");
    for n in 1..=LONGEST {
        let tokens: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
        let mut times = Vec::with_capacity(REPS);
        for rep in 0..=REPS {
            let started = Instant::now();
            session.feed_scored(&tokens)?;
            session.argmax_rows()?;
            let seconds = started.elapsed().as_secs_f64();
            session.truncate(CONTEXT);
            if rep > 0 {
                times.push(seconds);
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[REPS / 2];
        if n == 1 {
            plain = median;
        }
        println!("{n:>7} {:>10.2} {:>14.2}", median * 1e3, median / plain);
    }
    Ok(())
}
