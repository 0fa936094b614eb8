// Command protogen generates the Go code of the repository's .proto files
// without protoc: it compiles them with github.com/bufbuild/protocompile,
// hands the descriptors to the code generator plugins protoc-gen-go and
// protoc-gen-go-grpc as protoc would (a CodeGeneratorRequest on stdin, a
// CodeGeneratorResponse on stdout), and writes the files they return.
//
// Every version is pinned by this module's go.mod: protocompile as a
// requirement, the two plugins as tool directives, which `go tool` builds
// (once; the Go build cache keeps the binaries) and runs.
//
// Run from this directory:
//
//	go run . -root ../.. -out ../.. api/lifecycle/v1/lifecycle.proto
//
// (go generate ./api/... in the main module runs exactly that.) The main
// module's test of api/lifecycle/v1 runs it with -out set to a temporary
// directory and fails on any difference from the checked-in files.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// plugins are the code generators run, as tools of this module, with their
// parameters.
var plugins = []struct{ tool, param string }{
	{"protoc-gen-go", "paths=source_relative"},
	{"protoc-gen-go-grpc", "paths=source_relative"},
}

func main() {
	root := flag.String("root", "../..", "the import root: .proto paths are relative to it")
	out := flag.String("out", "", "where to write the generated files (paths relative to it, as the .proto paths are to -root); required")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: protogen -root DIR -out DIR FILE.proto...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if !fileExists("go.mod") {
		fmt.Fprintln(os.Stderr, "protogen: run it from its own module's directory (tools/protogen), whose go.mod pins the plugins")
		os.Exit(2)
	}
	if err := generate(context.Background(), *root, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

// generate compiles files (relative to root) and writes what every plugin
// generates from them under out.
func generate(ctx context.Context, root, out string, files []string) error {
	req, err := request(ctx, root, files)
	if err != nil {
		return err
	}
	for _, p := range plugins {
		req.Parameter = proto.String(p.param)
		in, err := proto.Marshal(req)
		if err != nil {
			return err
		}
		resp, err := runPlugin(ctx, p.tool, in)
		if err != nil {
			return err
		}
		for _, f := range resp.GetFile() {
			if f.GetInsertionPoint() != "" {
				return fmt.Errorf("%s: insertion points are not supported (%s)", p.tool, f.GetName())
			}
			name := filepath.FromSlash(f.GetName())
			if !filepath.IsLocal(name) {
				return fmt.Errorf("%s: output path %q is not inside -out", p.tool, f.GetName())
			}
			path := filepath.Join(out, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// request compiles files and returns the plugins' request: the files to
// generate and every file they import, dependencies first.
func request(ctx context.Context, root string, files []string) (*pluginpb.CodeGeneratorRequest, error) {
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{root}}),
		// Comments become the generated code's doc comments.
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	compiled, err := c.Compile(ctx, files...)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", strings.Join(files, " "), err)
	}
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: files}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		fdp := protodesc.ToFileDescriptorProto(fd)
		req.ProtoFile = append(req.ProtoFile, fdp)
		req.SourceFileDescriptors = append(req.SourceFileDescriptors, sourceOnly(fdp, files))
	}
	for _, f := range compiled {
		add(f)
	}
	// SourceFileDescriptors holds the files to generate only.
	kept := req.SourceFileDescriptors[:0]
	for _, fdp := range req.SourceFileDescriptors {
		if fdp != nil {
			kept = append(kept, fdp)
		}
	}
	req.SourceFileDescriptors = kept
	return req, nil
}

// sourceOnly returns fdp when it is one of the files to generate, else nil.
func sourceOnly(fdp *descriptorpb.FileDescriptorProto, files []string) *descriptorpb.FileDescriptorProto {
	for _, f := range files {
		if fdp.GetName() == f {
			return fdp
		}
	}
	return nil
}

// runPlugin runs one of this module's tools as a protoc plugin.
func runPlugin(ctx context.Context, tool string, in []byte) (*pluginpb.CodeGeneratorResponse, error) {
	goBin, err := goCommand()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, goBin, "tool", tool)
	// The working directory is this module's (protogen runs as go run .
	// from it): its go.mod pins the tools.
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go tool %s: %w: %s", tool, err, strings.TrimSpace(stderr.String()))
	}
	resp := &pluginpb.CodeGeneratorResponse{}
	if err := proto.Unmarshal(stdout.Bytes(), resp); err != nil {
		return nil, fmt.Errorf("go tool %s: decoding its response: %w", tool, err)
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("go tool %s: %s", tool, resp.GetError())
	}
	return resp, nil
}

// goCommand returns the go command: the one of GOROOT when set (go run
// sets it), else the one on PATH.
func goCommand() (string, error) {
	if r := os.Getenv("GOROOT"); r != "" {
		if p := filepath.Join(r, "bin", "go"); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("no go command: neither $GOROOT/bin/go nor go on PATH")
	}
	return p, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
