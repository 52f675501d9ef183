//! `anelm service install|uninstall|status`: run `anelm serve` as a per-user service that starts
//! at login and restarts on failure — a systemd user unit on Linux (logs in the journal), a
//! launchd user agent on macOS (logs in `~/Library/Logs/anelm/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Args, FromArgMatches, Subcommand};

use crate::serve::ServeArgs;

/// Name of the systemd unit.
const UNIT: &str = "anelm.service";
/// Label of the launchd agent.
const LABEL: &str = "dev.anelm.serve";

/// Arguments of `anelm service`.
#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub action: Action,
}

/// What to do with the service.
#[derive(Subcommand, Debug)]
pub enum Action {
    /// Write the service definition for `anelm serve ARGS...` and start it (now and at login).
    Install {
        /// Write the definition only; do not ask systemd/launchd to load or start it.
        #[arg(long)]
        no_start: bool,
        /// Arguments of `anelm serve` (after `--`), e.g. `-- --background --idle-unload 600`.
        #[arg(last = true)]
        serve_args: Vec<String>,
    },
    /// Stop the service and remove its definition.
    Uninstall {
        /// Remove the definition only; do not ask systemd/launchd to stop it.
        #[arg(long)]
        no_start: bool,
    },
    /// Show the service's definition path and what systemd/launchd says about it.
    Status,
}

/// Where service definitions go: `$ANELM_SERVICE_DIR` if set (tests, unusual setups), else the
/// platform's per-user place.
fn service_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("ANELM_SERVICE_DIR") {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).context("HOME is not set")?;
    Ok(if cfg!(target_os = "macos") {
        home.join("Library/LaunchAgents")
    } else {
        std::env::var_os("XDG_CONFIG_HOME")
            .map_or_else(|| home.join(".config"), PathBuf::from)
            .join("systemd/user")
    })
}

fn definition_path() -> Result<PathBuf> {
    Ok(service_dir()?.join(if cfg!(target_os = "macos") {
        format!("{LABEL}.plist")
    } else {
        UNIT.to_string()
    }))
}

/// Quote one argument for a systemd `ExecStart=` line.
fn systemd_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+".contains(c)) {
        a.to_string()
    } else {
        format!(
            "\"{}\"",
            a.replace('\\', "\\\\").replace('"', "\\\"").replace('%', "%%")
        )
    }
}

fn xml_escape(a: &str) -> String {
    a.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The systemd user unit running `exe serve args`.
pub fn systemd_unit(exe: &Path, args: &[String]) -> String {
    let mut exec = vec![systemd_quote(&exe.to_string_lossy()), "serve".to_string()];
    exec.extend(args.iter().map(|a| systemd_quote(a)));
    format!(
        "[Unit]\nDescription=anelm: OpenAI-compatible LLM server\nAfter=network.target\n\n\
         [Service]\nExecStart={}\nRestart=on-failure\nRestartSec=5\n\
         # Keys for --api-key / --upstream-key environment variables, one NAME=value per line:\n\
         EnvironmentFile=-%h/.config/anelm/env\n\n[Install]\nWantedBy=default.target\n",
        exec.join(" ")
    )
}

/// The launchd user agent running `exe serve args`, logging to `log_dir`.
pub fn launchd_plist(exe: &Path, args: &[String], log_dir: &Path) -> String {
    let mut program = format!(
        "    <string>{}</string>\n    <string>serve</string>\n",
        xml_escape(&exe.to_string_lossy())
    );
    for a in args {
        program.push_str(&format!("    <string>{}</string>\n", xml_escape(a)));
    }
    let log = xml_escape(&log_dir.join("serve.log").to_string_lossy());
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n<dict>\n  <key>Label</key>\n  <string>{LABEL}</string>\n\
         \x20 <key>ProgramArguments</key>\n  <array>\n{program}  </array>\n\
         \x20 <key>RunAtLoad</key>\n  <true/>\n\
         \x20 <key>KeepAlive</key>\n  <dict>\n    <key>SuccessfulExit</key>\n    <false/>\n  </dict>\n\
         \x20 <key>ProcessType</key>\n  <string>Background</string>\n\
         \x20 <key>StandardOutPath</key>\n  <string>{log}</string>\n\
         \x20 <key>StandardErrorPath</key>\n  <string>{log}</string>\n</dict>\n</plist>\n"
    )
}

fn run_tool(program: &str, args: &[&str]) -> Result<()> {
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("could not run {program} (use --no-start to only write the definition)"))?;
    if !status.success() {
        bail!("{program} {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn uid() -> Result<String> {
    let out = Command::new("id").arg("-u").output().context("could not run id -u")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Run `anelm service`.
pub fn run(a: ServiceArgs) -> Result<()> {
    let path = definition_path()?;
    match a.action {
        Action::Install { no_start, serve_args } => {
            // The arguments must be valid for `anelm serve` now, not at the next login.
            let cmd = <ServeArgs as Args>::augment_args(clap::Command::new("serve").no_binary_name(true));
            let matches = cmd
                .try_get_matches_from(&serve_args)
                .map_err(|e| anyhow::anyhow!("the serve arguments are invalid: {e}"))?;
            ServeArgs::from_arg_matches(&matches)
                .map_err(|e| anyhow::anyhow!("the serve arguments are invalid: {e}"))?;
            let exe = std::env::current_exe()
                .context("could not find this anelm binary")?
                .canonicalize()
                .context("could not resolve this anelm binary's path")?;
            let text = if cfg!(target_os = "macos") {
                let home = std::env::var_os("HOME").map(PathBuf::from).context("HOME is not set")?;
                let logs = home.join("Library/Logs/anelm");
                std::fs::create_dir_all(&logs).with_context(|| format!("could not create {}", logs.display()))?;
                launchd_plist(&exe, &serve_args, &logs)
            } else {
                systemd_unit(&exe, &serve_args)
            };
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
            }
            std::fs::write(&path, text).with_context(|| format!("could not write {}", path.display()))?;
            eprintln!("wrote {}", path.display());
            if !no_start {
                if cfg!(target_os = "macos") {
                    let target = format!("gui/{}", uid()?);
                    let _ = run_tool("launchctl", &["bootout", &format!("{target}/{LABEL}")]);
                    run_tool("launchctl", &["bootstrap", &target, &path.to_string_lossy()])?;
                } else {
                    run_tool("systemctl", &["--user", "daemon-reload"])?;
                    run_tool("systemctl", &["--user", "enable", "--now", UNIT])?;
                }
                eprintln!("started; it starts again at login and restarts on failure");
            }
            Ok(())
        }
        Action::Uninstall { no_start } => {
            if !no_start {
                if cfg!(target_os = "macos") {
                    let _ = run_tool("launchctl", &["bootout", &format!("gui/{}/{LABEL}", uid()?)]);
                } else {
                    let _ = run_tool("systemctl", &["--user", "disable", "--now", UNIT]);
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => eprintln!("removed {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    eprintln!("no service definition at {}", path.display())
                }
                Err(e) => return Err(e).with_context(|| format!("could not remove {}", path.display())),
            }
            if !no_start && !cfg!(target_os = "macos") {
                let _ = run_tool("systemctl", &["--user", "daemon-reload"]);
            }
            Ok(())
        }
        Action::Status => {
            if path.exists() {
                println!("definition: {}", path.display());
            } else {
                println!("not installed (no {})", path.display());
                return Ok(());
            }
            let shown = if cfg!(target_os = "macos") {
                Command::new("launchctl")
                    .args(["print", &format!("gui/{}/{LABEL}", uid()?)])
                    .status()
            } else {
                Command::new("systemctl")
                    .args(["--user", "status", "--no-pager", UNIT])
                    .status()
            };
            if shown.is_err() {
                println!("(the service manager could not be asked)");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_carry_the_binary_and_quoted_arguments() {
        let args = vec![
            "--background".to_string(),
            "--model-id".to_string(),
            "my model".to_string(),
        ];
        let unit = systemd_unit(Path::new("/opt/anelm/bin/anelm"), &args);
        assert!(
            unit.contains("ExecStart=/opt/anelm/bin/anelm serve --background --model-id \"my model\"\n"),
            "{unit}"
        );
        assert!(unit.contains("Restart=on-failure") && unit.contains("WantedBy=default.target"));
        let plist = launchd_plist(
            Path::new("/Applications/a&b/anelm"),
            &args,
            Path::new("/Users/u/Library/Logs/anelm"),
        );
        assert!(
            plist.contains("<string>/Applications/a&amp;b/anelm</string>"),
            "{plist}"
        );
        assert!(plist.contains("<string>my model</string>") && plist.contains("<key>KeepAlive</key>"));
        assert!(plist.contains("/Users/u/Library/Logs/anelm/serve.log"));
        assert_eq!(systemd_quote("50%"), "\"50%%\"");
    }
}
