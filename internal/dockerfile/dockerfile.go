// Package dockerfile reads deploy/Dockerfile's recipe, the go build of its
// build stage and what its final stage is made of, so that every test that
// builds pleg builds the binary the image has: test/e2e builds the image
// itself from the recipe, the other suites their binary with Build.
package dockerfile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Recipe is what a Dockerfile says its image is.
type Recipe struct {
	GoEnv      []string // VAR=value words before `go build`, e.g. CGO_ENABLED=0
	GoFlags    []string // go build's flags, without -o
	Pkg        string   // the package built, e.g. ./cmd/pleg
	BuildOut   string   // go build -o, in the build stage
	Base       string   // the final stage's FROM, e.g. busybox:1.37
	BinPath    string   // where the final stage copies the binary
	Entrypoint []string
	Cmd        []string
	User       string // USER; empty: root
}

// Parse reads the subset of the Dockerfile syntax that deploy/Dockerfile
// uses and fails on anything else, so that a change to the Dockerfile that
// the tests cannot follow stops them instead of building something else.
func Parse(path string) (Recipe, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Recipe{}, err
	}
	var (
		r      Recipe
		stages []string // stage names ("" when unnamed), in order
	)
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		final := len(stages) > 0 && stages[len(stages)-1] == ""
		switch strings.ToUpper(instr) {
		case "FROM":
			w := strings.Fields(rest)
			switch {
			case len(w) == 1:
				stages = append(stages, "")
				r.Base = w[0]
			case len(w) == 3 && strings.EqualFold(w[1], "AS"):
				stages = append(stages, w[2])
			default:
				return r, fmt.Errorf("%s: cannot follow FROM %s", path, rest)
			}
		case "WORKDIR":
			if final {
				return r, fmt.Errorf("%s: cannot follow WORKDIR in the final stage", path)
			}
		case "RUN":
			if final || len(stages) == 0 {
				return r, fmt.Errorf("%s: cannot follow RUN in the final stage: the image is the base plus the binary", path)
			}
			words, err := shellWords(rest)
			if err != nil {
				return r, fmt.Errorf("%s: RUN %s: %w", path, rest, err)
			}
			env := words
			for len(words) > 0 && strings.Contains(words[0], "=") {
				words = words[1:]
			}
			env = env[:len(env)-len(words)]
			switch {
			case len(words) == 3 && words[0] == "go" && words[1] == "mod" && words[2] == "download":
				// Fills the module cache: no part of the image.
			case len(words) > 2 && words[0] == "go" && words[1] == "build":
				r.GoEnv = env
				args := words[2:]
				for j := 0; j < len(args); j++ {
					switch {
					case args[j] == "-o" && j+1 < len(args):
						r.BuildOut = args[j+1]
						j++
					case strings.HasPrefix(args[j], "-"):
						r.GoFlags = append(r.GoFlags, args[j])
					case r.Pkg == "":
						r.Pkg = args[j]
					default:
						return r, fmt.Errorf("%s: RUN %s: more than one package", path, rest)
					}
				}
			default:
				return r, fmt.Errorf("%s: cannot follow RUN %s", path, rest)
			}
		case "COPY":
			w := strings.Fields(rest)
			if !final {
				continue // the build stage's sources: the repository
			}
			if len(w) != 3 || !strings.HasPrefix(w[0], "--from=") {
				return r, fmt.Errorf("%s: cannot follow COPY %s in the final stage", path, rest)
			}
			if w[1] != r.BuildOut {
				return r, fmt.Errorf("%s: the final stage copies %s, the build writes %s", path, w[1], r.BuildOut)
			}
			r.BinPath = w[2]
		case "ENTRYPOINT", "CMD":
			var words []string
			if err := json.Unmarshal([]byte(rest), &words); err != nil {
				return r, fmt.Errorf("%s: %s must be a JSON array (exec form): %w", path, instr, err)
			}
			if strings.ToUpper(instr) == "CMD" {
				r.Cmd = words
			} else {
				r.Entrypoint = words
			}
		case "USER":
			r.User = rest
		default:
			return r, fmt.Errorf("%s: the tests (internal/dockerfile) cannot follow %s", path, l)
		}
	}
	switch {
	case r.Pkg == "" || r.BuildOut == "":
		return r, fmt.Errorf("%s: no `go build -o OUT PACKAGE` in a build stage", path)
	case r.BinPath == "":
		return r, fmt.Errorf("%s: the final stage copies no binary", path)
	case len(stages) == 0 || stages[len(stages)-1] != "":
		return r, fmt.Errorf("%s: the final stage must be unnamed", path)
	}
	return r, nil
}

// shellWords splits a RUN line as sh would for the plain words, single and
// double quotes the Dockerfile uses; anything needing a shell is refused.
func shellWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	for _, c := range s {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case strings.ContainsRune(`\$;&|<>()`+"`", c):
			return nil, fmt.Errorf("%q needs a shell", c)
		default:
			cur.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, errors.New("unterminated quote")
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// Command is the recipe's go build, run with goBin in repoRoot, writing the
// binary to out. The Dockerfile's Go image stamps the binary with the
// commit (-buildvcs=auto, its default); this machine's go env may say
// otherwise, and a flag beats GOFLAGS.
func (r Recipe) Command(ctx context.Context, goBin, repoRoot, out string) *exec.Cmd {
	args := append([]string{"build", "-buildvcs=auto"}, r.GoFlags...)
	args = append(args, "-o", out, r.Pkg)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), r.GoEnv...)
	return cmd
}

// String is the recipe's go build as a command line.
func (r Recipe) String() string {
	return strings.TrimSpace(strings.Join(r.GoEnv, " ") + " go build " + strings.Join(r.GoFlags, " ") + " " + r.Pkg)
}

// Build builds pleg into out as repoRoot's deploy/Dockerfile does, with
// the go command on PATH.
func Build(ctx context.Context, repoRoot, out string) error {
	r, err := Parse(filepath.Join(repoRoot, "deploy", "Dockerfile"))
	if err != nil {
		return err
	}
	if b, err := r.Command(ctx, "go", repoRoot, out).CombinedOutput(); err != nil {
		return fmt.Errorf("%s (deploy/Dockerfile's build): %v\n%s", r, err, b)
	}
	return nil
}
