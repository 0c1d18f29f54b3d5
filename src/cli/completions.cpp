#include "cli/completions.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "cli/option_table.hpp"

namespace looplock {

namespace {

// The scripts, their option-dependent parts marked @NAME@ (filled in below).
constexpr std::string_view kBash = R"SCRIPT(# bash completion for looplock(1)                          -*- shell-script -*-
# Made by `looplock --completions bash` from its option table: edit that.
#
# Completes looplock's options, the values of -p/--policy and --log-format
# (also after a group of short options such as -qp), files and directories
# where an option takes one, DIR as a directory (several with --inspect),
# and after "--" the command and its arguments (through bash-completion's
# _command_offset when it is loaded, else command names and file names).
# Needs no other part of bash-completion.

# Options that take a value (the next word, or "--opt=value"), and the short
# options among them (a group like -qp ends with one).
_looplock_value_opts='@VALUE_OPTS@'
_looplock_value_shorts=@VALUE_SHORTS@

# The option whose value a word is, for a word "-qp" (a group of short
# options ending in one that takes a value): "-p"; for "--policy": itself;
# else nothing.
_looplock_value_opt()
{
    local word=$1
    case $word in
        --*=* | -) return 1 ;;
        --*)
            case " ${_looplock_value_opts//$'\n'/ } " in
                *" $word "*) printf '%s\n' "$word" ;;
                *) return 1 ;;
            esac
            ;;
        -*)
            # The first value-taking letter of the group decides: it takes the
            # rest of the word, or (when it is last) the next word.
            local i c
            for ((i = 1; i < ${#word}; i++)); do
                c=${word:i:1}
                if [[ $_looplock_value_shorts == *"$c"* ]]; then
                    ((i == ${#word} - 1)) && printf -- '-%s\n' "$c" && return 0
                    return 1
                fi
            done
            return 1
            ;;
        *) return 1 ;;
    esac
}

_looplock()
{
    local cur prev i word
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=
    ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}

    # Find "--" (the command follows), "-c" (a shell command follows),
    # --inspect, and whether DIR has been given, skipping the values of value
    # options.
    local have_dir=0 skip=0 inspect=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if ((skip)); then
            skip=0
            continue
        fi
        case $word in
            --)
                ((inspect)) && return 0  # --inspect takes no command
                _looplock_command $((i + 1))
                return 0
                ;;
            -c)
                # The shell command is one quoted word: nothing to offer.
                return 0
                ;;
            --inspect) inspect=1 ;;
            --*=*) ;;
            -*)
                _looplock_value_opt "$word" >/dev/null && skip=1
                ;;
            =)  # "--policy=x" split at "=" by COMP_WORDBREAKS
                ;;
            *)
                # a value after "--opt =" (split at "="), else DIR
                if [[ ${COMP_WORDS[i - 1]} != = ]]; then
                    have_dir=1
                fi
                ;;
        esac
    done

    # The value of an option ("-p x", "-qp x", "--policy x", "--policy=x").
    local opt= val=$cur prefix=
    if [[ $cur == --*=* ]]; then
        opt=${cur%%=*}
        val=${cur#*=}
        prefix="$opt="
    elif [[ $prev == = ]] && ((COMP_CWORD >= 2)); then
        opt=${COMP_WORDS[COMP_CWORD - 2]}
    elif [[ $cur == = ]]; then
        opt=$prev
        val=
    elif [[ $cur == -[!-]* ]] && ! _looplock_value_opt "$cur" >/dev/null; then
        # "-pmon", "-qpmon": a short option's value attached to it.
        local j
        for ((j = 1; j < ${#cur}; j++)); do
            if [[ $_looplock_value_shorts == *"${cur:j:1}"* ]]; then
                opt=-${cur:j:1}
                prefix=${cur:0:j+1}
                val=${cur:j+1}
                break
            fi
        done
    else
        opt=$(_looplock_value_opt "$prev")
    fi
    if [[ -n $opt ]]; then
        case $opt in
@VALUE_CASES@            *)
                # a number, a duration, a name or endpoints: nothing to offer
                COMPREPLY=()
                ;;
        esac
        return 0
    fi

    if [[ $cur == -* ]]; then
        local opts='@OPTS@'
        # --inspect takes no command: neither "--" nor -c.
        ((inspect)) || opts+=' -c --'
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return 0
    fi

    if ((have_dir && !inspect)); then
        # After DIR: the command goes after "--", or a shell command after -c.
        mapfile -t COMPREPLY < <(compgen -W '-- -c' -- "$cur")
        return 0
    fi

    # DIR (with --inspect, one more DIR): a directory.
    compopt -o filenames 2>/dev/null
    mapfile -t COMPREPLY < <(compgen -d -- "$cur")
    return 0
}

# Completes the command that starts at word $1 and its arguments.
_looplock_command()
{
    local offset=$1
    if declare -F _comp_command_offset >/dev/null; then
        _comp_command_offset "$offset"
    elif declare -F _command_offset >/dev/null; then
        _command_offset "$offset"
    else
        local cur=${COMP_WORDS[COMP_CWORD]}
        if ((COMP_CWORD == offset)); then
            mapfile -t COMPREPLY < <(compgen -c -- "$cur")
        else
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
    fi
}

complete -F _looplock looplock

# ex: filetype=sh
)SCRIPT";

constexpr std::string_view kZsh = R"SCRIPT(#compdef looplock
# zsh completion for looplock(1): options, the values of -p/--policy and
# --log-format, files and directories where an option takes one, DIR as a
# directory (several with --inspect), and after "--" the command and its
# arguments. Made by `looplock --completions zsh` from its option table:
# edit that.

_looplock() {
  # After "--" the rest is a command line of its own (--inspect takes none).
  local -i dd=${words[(i)--]}
  if (( dd < CURRENT )); then
    (( ${words[(I)--inspect]} && ${words[(I)--inspect]} < dd )) && return 1
    shift $dd words
    (( CURRENT -= dd ))
    _normal
    return
  fi

@WORD_ARRAYS@  local context state state_descr line ret=1
  typeset -A opt_args

  _arguments -s -C \
@SPECS@    '(@NOT_WITH_C@)-c[run SHELL-COMMAND with /bin/sh -c]:shell command:' \
    '1:loop directory:_files -/' \
    '*: :->after_dir' \
    && ret=0

  case $state in
@WORD_STATES@    after_dir)
      if (( ${+opt_args[--inspect]} )); then
        # --inspect reports on several DIRs; it runs no command.
        _files -/ && ret=0
      else
        local -a seps=(
          '--:end of options: COMMAND follows'
          '-c:SHELL-COMMAND follows'
        )
        _describe -t separators 'separator' seps && ret=0
      fi ;;
  esac
  return ret
}

_looplock "$@"
)SCRIPT";

constexpr std::string_view kFish = R"SCRIPT(# fish completion for looplock(1): options, the values of -p/--policy and
# --log-format, files and directories where an option takes one, DIR as a
# directory (several with --inspect), and after "--" the command and its
# arguments. Made by `looplock --completions fish` from its option table:
# edit that.

# Options that take a value (skipped when looking for DIR).
set -g __looplock_value_opts @VALUE_OPTS@

# Whether the command line (before the cursor) has a "--" or "-c": then
# looplock's own options are over.
function __looplock_options_over
    set -l tokens (commandline -opc)
    contains -- -- $tokens; or contains -- -c $tokens
end

function __looplock_after_dashdash
    contains -- -- (commandline -opc)
end

function __looplock_inspect
    contains -- --inspect (commandline -opc)
end

# Whether a positional argument (DIR) has been given, skipping the values of
# the options that take one (also after a group such as -qp).
function __looplock_have_dir
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l skip 0
    for t in $tokens
        if test $skip -eq 1
            set skip 0
            continue
        end
        switch $t
            case -- -- -c
                return 1
            case '--*=*'
            case '--*'
                contains -- $t $__looplock_value_opts; and set skip 1
            case '-*'
                # -qp: the group's first value-taking letter is its last
                if string match -qr -- '^-[^@VALUE_SHORTS@]*[@VALUE_SHORTS@]$' $t
                    set skip 1
                end
            case '*'
                return 0
        end
    end
    return 1
end

# DIR is to be completed: none given yet, or one more for --inspect.
function __looplock_needs_dir
    not __looplock_options_over; or return 1
    __looplock_inspect; or not __looplock_have_dir
end

# Completes the command after "--" as a command line of its own.
function __looplock_complete_command
    set -l tokens (commandline -opc)
    set -l i (contains -i -- -- $tokens)
    set -l cmd
    if test $i -lt (count $tokens)
        set cmd (string escape -- $tokens[(math $i + 1)..-1])
    end
    complete -C (string join -- ' ' $cmd (commandline -ct))
end

complete -c looplock -f
set -l opts 'not __looplock_options_over'

@OPTIONS@# --inspect takes no command, so no -c with it.
complete -c looplock -n "$opts; and not __looplock_inspect" -s c -x -d 'Run SHELL-COMMAND with /bin/sh -c'

# DIR (several with --inspect), then "--" or -c, then the command.
complete -c looplock -n '__looplock_needs_dir' -x -a '(__fish_complete_directories (commandline -ct) "loop directory")'
complete -c looplock -n 'not __looplock_needs_dir; and not __looplock_options_over; and not __looplock_inspect' -x -a '
    --\t"end of options: COMMAND follows"
    -c\t"SHELL-COMMAND follows"'
complete -c looplock -n '__looplock_after_dashdash; and not __looplock_inspect' -x -a '(__looplock_complete_command)'
)SCRIPT";

// `text` with each mark replaced.
std::string fill(std::string_view text, const std::vector<std::pair<std::string_view, std::string>>& parts) {
  std::string out(text);
  for (const auto& [mark, part] : parts) {
    for (size_t at = out.find(mark); at != std::string::npos; at = out.find(mark, at + part.size())) {
      out.replace(at, mark.size(), part);
    }
  }
  return out;
}

// The options a shell completes (those with a description), in table order.
std::vector<const OptionSpec*> completed() {
  std::vector<const OptionSpec*> out;
  for (const auto& o : option_table()) {
    if (!o.brief.empty()) out.push_back(&o);
  }
  return out;
}

// "-p --policy", or "--ttl".
std::vector<std::string> names(const OptionSpec& o) {
  std::vector<std::string> out;
  if (o.letter) out.push_back(std::string("-") + o.letter);
  out.push_back("--" + std::string(o.name));
  return out;
}

// Words joined by spaces, broken before `width` columns; each later line
// starts with `indent` (after `join`: " \\" for fish, nothing for a quoted
// bash word).
std::string wrapped(const std::vector<std::string>& words, std::string_view join, std::string_view indent,
                    size_t first_column) {
  constexpr size_t kWidth = 110;
  std::string out;
  size_t column = first_column;
  for (const auto& w : words) {
    if (!out.empty() && column + 1 + w.size() > kWidth) {
      out += std::string(join) + "\n" + std::string(indent);
      column = indent.size();
    } else if (!out.empty()) {
      out += ' ';
      ++column;
    }
    out += w;
    column += w.size();
  }
  return out;
}

std::vector<std::string> value_option_names() {
  std::vector<std::string> out;
  for (const OptionSpec* o : completed()) {
    if (o->value.empty()) continue;
    for (auto& n : names(*o)) out.push_back(std::move(n));
  }
  return out;
}

std::string value_shorts() {
  std::string out;
  for (const OptionSpec* o : completed()) {
    if (!o->value.empty() && o->letter) out += o->letter;
  }
  return out;
}

std::string words_of(const OptionSpec& o) {
  std::string out;
  for (const auto& w : o.words) out += (out.empty() ? "" : " ") + std::string(w.word);
  return out;
}

// --- bash ---------------------------------------------------------------------

// The case arm (a pattern and its reply) for the options of one kind of value.
std::string bash_arm(const std::vector<std::string>& patterns, std::string_view body) {
  std::string head;
  for (const auto& p : patterns) head += (head.empty() ? "" : " | ") + p;
  return "            " + head + ")\n" + std::string(body) + "                ;;\n";
}

std::string bash_value_cases() {
  std::string out;
  std::vector<std::string> dirs, files, pids;
  for (const OptionSpec* o : completed()) {
    const auto n = names(*o);
    if (o->completes == Completes::Words) {
      std::string pattern;
      out += bash_arm(n, "                mapfile -t COMPREPLY < <(compgen -P \"$prefix\" -W '" + words_of(*o) +
                             "' -- \"$val\")\n");
    }
    auto& into = o->completes == Completes::Dir ? dirs : o->completes == Completes::File ? files : pids;
    if (o->completes == Completes::Dir || o->completes == Completes::File || o->completes == Completes::Pid) {
      into.insert(into.end(), n.begin(), n.end());
    }
  }
  if (!dirs.empty()) {
    out += bash_arm(dirs, "                compopt -o filenames 2>/dev/null\n"
                          "                mapfile -t COMPREPLY < <(compgen -P \"$prefix\" -d -- \"$val\")\n");
  }
  if (!files.empty()) {
    out += bash_arm(files, "                compopt -o filenames 2>/dev/null\n"
                           "                mapfile -t COMPREPLY < <(compgen -P \"$prefix\" -f -- \"$val\")\n");
  }
  if (!pids.empty()) {
    out += bash_arm(pids, "                mapfile -t COMPREPLY < <(compgen -P \"$prefix\" -W \"$(cd /proc 2>/dev/null && "
                          "printf '%s ' [0-9]*)\" -- \"$val\")\n");
  }
  return out;
}

std::string bash_script() {
  std::vector<std::string> all;
  for (const OptionSpec* o : completed()) {
    for (auto& n : names(*o)) all.push_back(std::move(n));
  }
  return fill(kBash, {{"@VALUE_OPTS@", wrapped(value_option_names(), "", "    ", 22)},
                      {"@VALUE_SHORTS@", value_shorts()},
                      {"@VALUE_CASES@", bash_value_cases()},
                      {"@OPTS@", wrapped(all, "", "            ", 20)}});
}

// --- zsh ----------------------------------------------------------------------

// Text for inside a single-quoted word of _arguments: a description (its
// brackets escaped) or a message or word (its colons escaped).
std::string zsh_quoted(std::string_view text, bool message) {
  std::string out;
  for (char c : text) {
    if (c == '\'') {
      out += "'\"'\"'";
    } else if (message ? c == ':' : (c == '[' || c == ']')) {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out;
}

std::string zsh_array_name(const OptionSpec& o) {
  std::string out(o.name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out + "_words";
}

bool has_about(const OptionSpec& o) {
  return std::any_of(o.words.begin(), o.words.end(), [](const ValueWord& w) { return !w.about.empty(); });
}

bool is_mode(std::string_view name) { return name == "hold" || name == "release" || name == "inspect"; }
bool alone(std::string_view name) { return name == "help" || name == "version" || name == "completions"; }

// The options that cannot come with `o`: itself, those it conflicts with,
// the other modes, and -F against what needs looplock to stay the parent.
std::string zsh_exclusions(const OptionSpec& o) {
  if (alone(o.name)) return "- : *";
  std::vector<std::string> out = names(o);
  auto add = [&](std::string_view other) {
    if (const OptionSpec* x = find_option(other)) {
      for (auto& n : names(*x)) {
        if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
      }
    }
  };
  for (const auto& c : option_conflicts()) {
    if (c.a == o.name) add(c.b);
    if (c.b == o.name) add(c.a);
  }
  for (const OptionSpec* x : completed()) {
    if (is_mode(o.name) && is_mode(x->name) && x->name != o.name) add(x->name);
    if ((o.name == "no-fork" && x->not_with_no_fork) || (o.not_with_no_fork && x->name == "no-fork")) add(x->name);
  }
  if (o.applies == kInInspect || o.name == "inspect") out.push_back("-c");
  std::string text;
  for (const auto& n : out) text += (text.empty() ? "" : " ") + n;
  return text;
}

std::string zsh_action(const OptionSpec& o) {
  const std::string hint = zsh_quoted(o.hint, true);
  switch (o.completes) {
    case Completes::Text: return ":" + hint;
    case Completes::Words:
      return has_about(o) ? ":" + std::string(o.name) + ":->" + std::string(o.name)
                          : ":" + std::string(o.name) + ":(" + words_of(o) + ")";
    case Completes::Dir: return ":" + hint + ":_files -/";
    case Completes::File: return ":" + hint + ":_files";
    case Completes::Pid: return ":" + hint + ":_pids";
    case Completes::ShellCommand: return ":" + hint + ":_cmdstring";
  }
  return ":" + hint;
}

std::string zsh_spec(const OptionSpec& o) {
  const bool value = !o.value.empty();
  const std::string longname = "--" + std::string(o.name) + (value ? "=" : "");
  std::string spec = "    '(" + zsh_exclusions(o) + ")";
  if (o.letter) {
    spec += "'{-" + std::string(1, o.letter) + (value ? "+" : "") + "," + longname + "}'";
  } else {
    spec += longname;
  }
  spec += "[" + zsh_quoted(o.brief, false) + "]";
  if (value) spec += zsh_action(o);
  return spec + "' \\\n";
}

std::string zsh_script() {
  std::string specs, arrays, states, not_with_c = "--inspect";
  for (const OptionSpec* o : completed()) {
    specs += zsh_spec(*o);
    if (o->applies == kInInspect) not_with_c += " --" + std::string(o->name);
    if (o->completes != Completes::Words || !has_about(*o)) continue;
    arrays += "  local -a " + zsh_array_name(*o) + "=(\n";
    for (const auto& w : o->words) {
      arrays += "    '" + zsh_quoted(w.word, true) + ":" + zsh_quoted(w.about, false) + "'\n";
    }
    arrays += "  )\n";
    states += "    " + std::string(o->name) + ") _describe -t " + zsh_array_name(*o) + " '" + std::string(o->name) +
              "' " + zsh_array_name(*o) + " && ret=0 ;;\n";
  }
  return fill(kZsh, {{"@WORD_ARRAYS@", arrays}, {"@SPECS@", specs}, {"@NOT_WITH_C@", not_with_c},
                     {"@WORD_STATES@", states}});
}

// --- fish ---------------------------------------------------------------------

std::string fish_quoted(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

std::string fish_value(const OptionSpec& o) {
  switch (o.completes) {
    case Completes::Text: return " -x";
    case Completes::Words: {
      if (!has_about(o)) return " -x -a " + fish_quoted(words_of(o));
      std::string list;
      for (const auto& w : o.words) list += "\n    " + std::string(w.word) + "\\t\"" + std::string(w.about) + "\"";
      return " -x -a '" + list + "'";
    }
    case Completes::Dir:
      return " -x -a '(__fish_complete_directories (commandline -ct) \"" + std::string(o.hint) + "\")'";
    case Completes::File: return " -r -F";
    case Completes::Pid: return " -x -a '(__fish_complete_pids)'";
    case Completes::ShellCommand: return " -x -a '(__fish_complete_command)'";
  }
  return " -x";
}

std::string fish_script() {
  std::string options;
  for (const OptionSpec* o : completed()) {
    std::string line = "complete -c looplock -n $opts";
    if (o->letter) line += " -s " + std::string(1, o->letter);
    line += " -l " + std::string(o->name);
    if (!o->value.empty()) line += fish_value(*o);
    options += line + " -d " + fish_quoted(o->brief) + "\n";
  }
  return fill(kFish, {{"@VALUE_OPTS@", wrapped(value_option_names(), " \\", "    ", 29)},
                      {"@VALUE_SHORTS@", value_shorts()},
                      {"@OPTIONS@", options}});
}

}  // namespace

std::optional<std::string> completion_script(std::string_view shell) {
  if (shell == "bash") return bash_script();
  if (shell == "zsh") return zsh_script();
  if (shell == "fish") return fish_script();
  return std::nullopt;
}

}  // namespace looplock
