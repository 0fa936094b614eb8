// Command mkimage writes an OCI image-layout tar archive holding one or more
// images whose single layer contains one static binary. provision.sh uses it
// to build the e2e pause and workload images:
//
//	mkimage -binary workload -path /workload -out images.tar \
//	    -image 'docker.io/pleg/pause:e2e=pause' \
//	    -image 'docker.io/pleg/workload:e2e=run'
//
// Each -image is NAME=CMD, where CMD is the image's default Cmd as
// comma-separated words; every image gets Entrypoint [<path>]. Import the
// archive with `ctr -n k8s.io images import --snapshotter S images.tar`; the
// images are named exactly as given.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/podlifecycle/pleg/test/e2e/images/ocilayout"
)

type imageFlags []string

func (f *imageFlags) String() string     { return strings.Join(*f, " ") }
func (f *imageFlags) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	var (
		binary = flag.String("binary", "", "path of the binary to put in the layer (required)")
		path   = flag.String("path", "/workload", "path of the binary inside the image; also the Entrypoint")
		out    = flag.String("out", "", "output archive (required)")
		arch   = flag.String("arch", goruntime.GOARCH, "image architecture")
		images imageFlags
	)
	flag.Var(&images, "image", "NAME=CMD[,ARG...] (repeatable, at least one)")
	flag.Parse()
	if *binary == "" || *out == "" || len(images) == 0 || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*binary, *path, *out, *arch, images); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(binary, path, out, arch string, specs []string) error {
	data, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	opts := ocilayout.Options{
		Architecture: arch,
		Files:        []ocilayout.File{{Path: path, Mode: 0o755, Data: data}},
	}
	for _, s := range specs {
		name, cmd, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return fmt.Errorf("bad -image %q, want NAME=CMD", s)
		}
		img := ocilayout.Image{Name: name, Entrypoint: []string{path}}
		if cmd != "" {
			img.Cmd = strings.Split(cmd, ",")
		}
		opts.Images = append(opts.Images, img)
	}
	var buf bytes.Buffer
	if err := ocilayout.Write(&buf, opts); err != nil {
		return err
	}
	// Write atomically, and leave the file untouched when the content is
	// unchanged so its mtime says when the image last really changed.
	if old, err := os.ReadFile(out); err == nil && bytes.Equal(old, buf.Bytes()) {
		fmt.Printf("mkimage: %s unchanged\n", out)
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Printf("mkimage: wrote %s (%d bytes, %d images)\n", out, buf.Len(), len(opts.Images))
	return nil
}
