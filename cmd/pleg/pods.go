package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

func init() { register(newPodsCmd) }

type podsOptions struct {
	url     string
	noTrunc bool
	quiet   bool
	timeout time.Duration
}

func newPodsCmd() *cobra.Command {
	o := &podsOptions{}
	of := &outputFlag{}
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the pod sandboxes in a running daemon's cache, as crictl pods does",
		Long: `pods asks a running ` + "`pleg run`" + ` for its pod status cache (GET --url, the
daemon's /api/v1/pods) and prints one line per pod sandbox, newest first, in
crictl's layout:

  POD ID          CREATED          STATE    NAME      NAMESPACE   ATTEMPT
  3f1c9a2b7d6e4   5 minutes ago    Ready    web-0     default     0

IDs are cut to 13 characters unless --no-trunc. A pod the cache holds no
sandbox for (its inspection failed, say) has a line with POD ID "-" and
STATE Unknown, and its error goes to stderr.

  --output text   the table
  --output json   the daemon's JSON, indented`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runPods(cmd, o, of) },
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", defaultDaemonURL("/api/v1/pods"),
		"the daemon's /api/v1/pods URL; a URL without a path gets /api/v1/pods")
	f.BoolVar(&o.noTrunc, "no-trunc", false, "show whole IDs")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "print the pod sandbox IDs only, whole")
	durationVar(f, &o.timeout, "timeout", 10*time.Second, minClientTimeout, time.Hour, "give up after this long")
	of.addFlags(f)
	return cmd
}

func runPods(cmd *cobra.Command, o *podsOptions, of *outputFlag) error {
	u, err := checkURL(o.url, "/api/v1/pods")
	if err != nil {
		return err
	}
	ctx, stop := signalContext(cmd)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	raw, err := fetchPods(ctx, u, o.timeout)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if of.format == "json" {
		var b bytes.Buffer
		if err := json.Indent(&b, bytes.TrimSpace(raw), "", "  "); err != nil {
			return fmt.Errorf("the answer of pleg at %s is not JSON: %w", u, err)
		}
		b.WriteByte('\n')
		_, err := out.Write(b.Bytes())
		return err
	}
	var body httpapi.PodsBody
	if err := json.Unmarshal(raw, &body); err != nil {
		return fmt.Errorf("the answer of pleg at %s is not a pod list: %w", u, err)
	}
	rows := podRows(body.Pods)
	if o.quiet {
		for _, r := range rows {
			if r.id != "" {
				fmt.Fprintln(out, r.id)
			}
		}
		return nil
	}
	if err := writePodTable(out, rows, time.Now(), o.noTrunc); err != nil {
		return err
	}
	for _, p := range body.Pods {
		if p.Error != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "pleg: pod %s/%s: %s\n", p.Namespace, p.Name, p.Error)
		}
	}
	return nil
}

// fetchPods GETs the daemon's pod list.
func fetchPods(ctx context.Context, u string, timeout time.Duration) ([]byte, error) {
	resp, err := daemonGet(ctx, u, "application/json", timeout)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of pleg at %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("pleg at %s answered HTTP %d: %s", u, resp.StatusCode, firstLine(strings.TrimSpace(string(raw))))
	}
	return raw, nil
}

// podRow is one line of the table: one pod sandbox.
type podRow struct {
	id        string // "" when the cache holds no sandbox for the pod
	created   time.Time
	state     string
	name      string
	namespace string
	attempt   uint32
}

// podRows turns the cache into table rows, newest sandbox first.
func podRows(pods []httpapi.Pod) []podRow {
	var rows []podRow
	for _, p := range pods {
		if len(p.Sandboxes) == 0 {
			rows = append(rows, podRow{state: "Unknown", name: p.Name, namespace: p.Namespace})
			continue
		}
		for _, sb := range p.Sandboxes {
			created, _ := time.Parse(time.RFC3339Nano, sb.CreatedAt)
			rows = append(rows, podRow{id: sb.ID, created: created, state: sandboxStateName(sb.State),
				name: p.Name, namespace: p.Namespace, attempt: sb.Attempt})
		}
	}
	slices.SortStableFunc(rows, func(a, b podRow) int {
		return cmp.Or(b.created.Compare(a.created), cmp.Compare(a.namespace, b.namespace),
			cmp.Compare(a.name, b.name), cmp.Compare(a.id, b.id))
	})
	return rows
}

// sandboxStateName is crictl's name of a sandbox state.
func sandboxStateName(s string) string {
	switch s {
	case "running":
		return "Ready"
	case "exited":
		return "NotReady"
	}
	return "Unknown"
}

func writePodTable(w io.Writer, rows []podRow, now time.Time, noTrunc bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "POD ID\tCREATED\tSTATE\tNAME\tNAMESPACE\tATTEMPT")
	for _, r := range rows {
		id, created := "-", "-"
		if r.id != "" {
			id = r.id
			if !noTrunc {
				id = textfmt.ShortID(id)
			}
		}
		if !r.created.IsZero() {
			created = humanAgo(now.Sub(r.created))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", id, created, r.state, r.name, r.namespace, r.attempt)
	}
	return tw.Flush()
}

// humanAgo says how long ago something happened, in crictl's words:
// "Less than a second ago", "5 minutes ago", "About an hour ago".
func humanAgo(d time.Duration) string {
	count := func(n int64, unit string) string {
		if n == 1 {
			return "1 " + unit + " ago"
		}
		return fmt.Sprintf("%d %ss ago", n, unit)
	}
	const day = 24 * time.Hour
	switch {
	case d < time.Second:
		return "Less than a second ago"
	case d < time.Minute:
		return count(int64(d/time.Second), "second")
	case d < 2*time.Minute:
		return "About a minute ago"
	case d < time.Hour:
		return count(int64(d/time.Minute), "minute")
	case d < 2*time.Hour:
		return "About an hour ago"
	case d < 2*day:
		return count(int64(d/time.Hour), "hour")
	case d < 14*day:
		return count(int64(d/day), "day")
	case d < 60*day:
		return count(int64(d/(7*day)), "week")
	case d < 730*day:
		return count(int64(d/(30*day)), "month")
	}
	return count(int64(d/(365*day)), "year")
}
