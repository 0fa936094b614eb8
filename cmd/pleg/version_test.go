package main

import (
	"runtime/debug"
	"testing"
)

func TestVersionLine(t *testing.T) {
	for _, tc := range []struct {
		settings []debug.BuildSetting
		version  string
		want     string
	}{
		{
			settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"},
				{Key: "vcs.revision", Value: "9eef660d1a2b"}, {Key: "vcs.modified", Value: "false"}},
			version: "v0.0.0-20261123121500-9eef660d1a2b",
			want:    "pleg v0.0.0-20261123121500-9eef660d1a2b (commit 9eef660d1a2b, go1.26.8 linux/amd64)",
		},
		{
			settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}},
			version:  "v1.2.3+dirty",
			want:     "pleg v1.2.3+dirty (commit abc with local changes, go1.26.8)",
		},
		{want: "pleg (devel) (go1.26.8)"},
		{
			settings: []debug.BuildSetting{{Key: "-tags", Value: "grpcnotrace"}, {Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"}},
			want:     "pleg (devel) (go1.26.8 linux/arm64, tags grpcnotrace)",
		},
	} {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: tc.version}, Settings: tc.settings}
		if got := versionLine(bi); got != tc.want {
			t.Errorf("versionLine = %q, want %q", got, tc.want)
		}
	}
}
