//! Shell conventions: `provisioner completions bash|zsh|fish` (clap_complete) and
//! `provisioner man` (clap_mangen), both generated from the command's own definition, so they
//! never fall behind it. (`docs/provisioner.1` is `provisioner man`'s output, kept in step by a
//! test in `tests/cli.rs`.)

use std::io::Write;
use std::process::ExitCode;

use clap::ValueEnum;

/// The shells `completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// Bash (source it, or put it in `/usr/share/bash-completion/completions/provisioner`).
    Bash,
    /// Zsh (put it as `_provisioner` in a directory of `$fpath`).
    Zsh,
    /// Fish (put it in `~/.config/fish/completions/provisioner.fish`).
    Fish,
}

impl Shell {
    fn generator(self) -> clap_complete::Shell {
        match self {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        }
    }
}

/// The completion script of `command` for `shell`.
pub fn completion_script(mut command: clap::Command, shell: Shell) -> Vec<u8> {
    let name = command.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(shell.generator(), &mut command, name, &mut out);
    out
}

/// The man page of `command` (roff), one page for all: the command and its options, then a
/// section for each command (`provisioner machine add`, ...) with its synopsis, description
/// and options.
pub fn man_page(command: clap::Command) -> std::io::Result<Vec<u8>> {
    let mut command = command;
    command.build();
    let mut out = Vec::new();
    let page = clap_mangen::Man::new(command.clone());
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    for sub in shown(&command) {
        render_command(sub, &mut out)?;
    }
    page.render_version_section(&mut out)?;
    Ok(out)
}

/// The subcommands worth a section (not clap's `help`).
fn shown(command: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    command.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// A command's section: its full name as the heading; a group (`machine`) says what it is and
/// is followed by its commands, a command shows its synopsis and options (clap_mangen's
/// sections, one level down).
fn render_command(command: &clap::Command, out: &mut Vec<u8>) -> std::io::Result<()> {
    // Built, a subcommand knows its full name (`provisioner machine add`).
    let full = command.get_bin_name().unwrap_or(command.get_name()).to_owned();
    writeln!(out, ".SH \"{}\"", full.to_uppercase())?;
    let page = clap_mangen::Man::new(command.clone());
    let mut body = Vec::new();
    if command.has_subcommands() {
        page.render_description_section(&mut body)?;
    } else {
        page.render_synopsis_section(&mut body)?;
        page.render_description_section(&mut body)?;
        if command.get_arguments().any(|a| !a.is_hide_set()) {
            page.render_options_section(&mut body)?;
        }
    }
    for line in String::from_utf8_lossy(&body).lines() {
        match line.strip_prefix(".SH ") {
            Some(heading) => writeln!(out, ".SS {heading}")?,
            None => writeln!(out, "{line}")?,
        }
    }
    for sub in shown(command) {
        render_command(sub, out)?;
    }
    Ok(())
}

fn print(bytes: std::io::Result<Vec<u8>>) -> ExitCode {
    let written = bytes.and_then(|b| {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&b)?;
        stdout.flush()
    });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not worth a message; anything else is.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::from(1)
        }
    }
}

/// `provisioner completions SHELL`.
pub fn run_completions(command: clap::Command, shell: Shell) -> ExitCode {
    print(Ok(completion_script(command, shell)))
}

/// `provisioner man`.
pub fn run_man(command: clap::Command) -> ExitCode {
    print(man_page(command))
}
