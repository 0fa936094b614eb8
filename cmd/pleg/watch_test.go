package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/podlifecycle/pleg"
)

func TestTextEventPrinterAligns(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	three := int32(3)
	events := []pleg.Event{
		{Time: at, Type: pleg.ContainerStarted, PodName: "web-0", PodNamespace: "shop",
			ContainerID: "0123456789abcdef0123", ContainerName: "web-0", Sandbox: true},
		{Time: at, Type: pleg.ContainerDied, PodName: "api", PodNamespace: "default",
			ContainerID: "fedcba9876543210", ContainerName: "server", ExitCode: &three},
		{Time: at, Type: pleg.PodSync, PodName: "db", PodNamespace: "default"},
	}
	var buf bytes.Buffer
	for _, e := range events {
		if err := textEventPrinter(&buf, e); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	want := []string{
		"2026-03-04T05:06:07.891Z  ContainerStarted  shop/web-0                                (sandbox)                 0123456789abc  -",
		"2026-03-04T05:06:07.891Z  ContainerDied     default/api                               server                    fedcba9876543  3",
		"2026-03-04T05:06:07.891Z  PodSync           default/db                                -                         -              -",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines:\n%s", len(lines), buf.String())
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d =\n%q\nwant\n%q", i, lines[i], want[i])
		}
	}
}
