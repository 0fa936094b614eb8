package dockerfile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The repository's own Dockerfile: its recipe is what the tests build.
func TestParseDeployDockerfile(t *testing.T) {
	r, err := Parse("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if r.Pkg != "./cmd/pleg" || r.BuildOut == "" || r.BinPath == "" || !slices.Equal(r.Entrypoint, []string{r.BinPath}) {
		t.Errorf("recipe %+v", r)
	}
	if !slices.ContainsFunc(r.GoFlags, func(f string) bool { return strings.HasPrefix(f, "-tags=") }) {
		t.Errorf("go build flags %q: no build tags", r.GoFlags)
	}
	// A quoted flag is one word, its quotes gone.
	if !slices.ContainsFunc(r.GoFlags, func(f string) bool { return f == "-ldflags=-s -w" }) {
		t.Errorf("go build flags %q: want -ldflags=-s -w as one word", r.GoFlags)
	}
}

func TestParseRefuses(t *testing.T) {
	base := "FROM golang:1.26 AS build\nWORKDIR /src\nCOPY . .\nRUN CGO_ENABLED=0 go build -tags=x -o /out/pleg ./cmd/pleg\nFROM busybox:1.37\nCOPY --from=build /out/pleg /pleg\nENTRYPOINT [\"/pleg\"]\n"
	for name, tc := range map[string]struct{ text, err string }{
		"the recipe":            {base, ""},
		"a shell":               {strings.Replace(base, "go build", "go build $(echo -v)", 1), "needs a shell"},
		"RUN in the final":      {base + "RUN rm -rf /\n", "cannot follow RUN in the final stage"},
		"an unknown step":       {base + "HEALTHCHECK CMD true\n", "cannot follow HEALTHCHECK"},
		"two packages":          {strings.Replace(base, "./cmd/pleg", "./cmd/pleg ./other", 1), "more than one package"},
		"another binary":        {strings.Replace(base, "--from=build /out/pleg", "--from=build /out/other", 1), "copies /out/other"},
		"no build":              {strings.Replace(base, "RUN CGO_ENABLED=0 go build -tags=x -o /out/pleg ./cmd/pleg\n", "", 1), ""},
		"shell-form ENTRYPOINT": {strings.Replace(base, `["/pleg"]`, "/pleg", 1), "JSON array"},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "Dockerfile")
			if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Parse(p)
			switch {
			case name == "the recipe":
				if err != nil || r.Pkg != "./cmd/pleg" || !slices.Equal(r.GoEnv, []string{"CGO_ENABLED=0"}) || !slices.Equal(r.GoFlags, []string{"-tags=x"}) || r.BinPath != "/pleg" {
					t.Fatalf("%+v, %v", r, err)
				}
			case name == "no build":
				if err == nil {
					t.Fatal("a Dockerfile without a go build parsed")
				}
			case err == nil || !strings.Contains(err.Error(), tc.err):
				t.Fatalf("error %v, want one saying %q", err, tc.err)
			}
		})
	}
}
