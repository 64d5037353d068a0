//! `idem-storm`: see `idem-storm --help` and the crate docs.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = idem_storm::Args::parse();
    // Injected panics are part of the storm; keep the terminal for the summary.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.starts_with("idem-storm: injected"));
        if !injected {
            default_hook(info);
        }
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Some(spec) = &args.chaos_worker {
        return match runtime.block_on(idem_storm::chaos::work(&args, spec)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idem-storm worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    let storm = async {
        if args.chaos.is_some() {
            let exe = std::env::current_exe().map_err(|e| {
                idem_storm::StormError::Setup(format!(
                    "cannot find this program to start workers: {e}"
                ))
            })?;
            idem_storm::chaos::storm(&args, &exe).await
        } else {
            idem_storm::run(&args).await
        }
    };
    let summary = match runtime.block_on(storm) {
        Ok(summary) => summary,
        Err(e) => {
            eprintln!("idem-storm: {e}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).expect("a summary serializes")
        );
    } else {
        println!("{summary}");
    }
    if let Some(path) = &args.plot {
        if let Err(e) = idem_storm::draw(&summary, path) {
            eprintln!("idem-storm: {e}");
            return ExitCode::from(2);
        }
        if !args.json {
            println!("  {:<20} {}", "plot", path.display());
        }
    }
    if summary.invariants_hold {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
