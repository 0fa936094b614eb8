// Package ocilayout writes single-layer container images as an OCI
// image-layout tar archive that `ctr images import` understands, using only
// the standard library. The e2e suite uses it (through cmd mkimage) to build
// its pause and workload images without a registry.
//
// Archive layout:
//
//	oci-layout                 {"imageLayoutVersion":"1.0.0"}
//	index.json                 one manifest descriptor per image name
//	blobs/sha256/<hex>         layer (tar+gzip), image configs, manifests
//
// Every index.json manifest descriptor carries two annotations:
// "io.containerd.image.name" with the full reference (containerd's importer
// uses it verbatim as the image name, e.g. docker.io/pleg/workload:e2e) and
// "org.opencontainers.image.ref.name" with just the tag, which is what
// containerd's own exporter writes and what OCI tools expect.
//
// Output is deterministic: the same inputs give byte-identical archives.
package ocilayout

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Media types and annotation keys used in the archive.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"

	AnnotationContainerdName = "io.containerd.image.name"
	AnnotationRefName        = "org.opencontainers.image.ref.name"
)

// epoch is the fixed timestamp used for files and the config "created"
// field, so archives are reproducible.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// File is one regular file, or a symbolic link when Link is set, placed in
// the (single) image layer.
type File struct {
	Path string // absolute path inside the image, e.g. /workload
	Mode int64  // permission bits, e.g. 0o755
	Data []byte
	Link string // symlink target (Mode and Data unused), e.g. busybox
}

// Image is one named image; all images of an archive share the same layer.
type Image struct {
	Name       string   // full reference, e.g. docker.io/pleg/pause:e2e
	Entrypoint []string // config Entrypoint
	Cmd        []string // config Cmd
	Env        []string // config Env
	User       string   // config User; empty runs as root
}

// Options describes an archive.
type Options struct {
	OS           string // "linux" if empty
	Architecture string // required, e.g. "amd64"
	Files        []File // layer content; parent directories are added
	Images       []Image
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Created      string        `json:"created"`
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Config       runConfig     `json:"config"`
	RootFS       rootFS        `json:"rootfs"`
	History      []historyItem `json:"history"`
}

type runConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type historyItem struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// Write writes the OCI image-layout archive described by opts to w.
func Write(w io.Writer, opts Options) error {
	if opts.Architecture == "" {
		return errors.New("ocilayout: Architecture is required")
	}
	if opts.OS == "" {
		opts.OS = "linux"
	}
	if len(opts.Images) == 0 {
		return errors.New("ocilayout: no images")
	}

	layerTar, err := layerTar(opts.Files)
	if err != nil {
		return err
	}
	diffID := digestOf(layerTar)
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if err != nil {
		return err
	}
	if _, err := zw.Write(layerTar); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	layer := gz.Bytes()

	blobs := map[string][]byte{}
	addBlob := func(mediaType string, data []byte) descriptor {
		d := digestOf(data)
		blobs[d] = data
		return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
	}
	layerDesc := addBlob(MediaTypeLayerGz, layer)

	idx := index{SchemaVersion: 2, MediaType: MediaTypeIndex}
	for _, img := range opts.Images {
		if img.Name == "" {
			return errors.New("ocilayout: image without a name")
		}
		env := img.Env
		if env == nil {
			env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		}
		cfg := imageConfig{
			Created:      epoch.Format(time.RFC3339),
			Architecture: opts.Architecture,
			OS:           opts.OS,
			Config: runConfig{
				User:       img.User,
				Env:        env,
				Entrypoint: img.Entrypoint,
				Cmd:        img.Cmd,
				WorkingDir: "/",
			},
			RootFS:  rootFS{Type: "layers", DiffIDs: []string{diffID}},
			History: []historyItem{{Created: epoch.Format(time.RFC3339), CreatedBy: "pleg e2e ocilayout"}},
		}
		cfgJSON, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		m := manifest{
			SchemaVersion: 2,
			MediaType:     MediaTypeManifest,
			Config:        addBlob(MediaTypeConfig, cfgJSON),
			Layers:        []descriptor{layerDesc},
		}
		mJSON, err := json.Marshal(m)
		if err != nil {
			return err
		}
		md := addBlob(MediaTypeManifest, mJSON)
		md.Annotations = map[string]string{
			AnnotationContainerdName: img.Name,
			AnnotationRefName:        tagOf(img.Name),
		}
		md.Platform = &platform{Architecture: opts.Architecture, OS: opts.OS}
		idx.Manifests = append(idx.Manifests, md)
	}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	if err := writeDir(tw, "blobs/"); err != nil {
		return err
	}
	if err := writeDir(tw, "blobs/sha256/"); err != nil {
		return err
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := writeFile(tw, "blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), 0o644, blobs[d]); err != nil {
			return err
		}
	}
	if err := writeFile(tw, "oci-layout", 0o644, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := writeFile(tw, "index.json", 0o644, idxJSON); err != nil {
		return err
	}
	return tw.Close()
}

// layerTar builds the uncompressed layer: the files plus their parent
// directories and a few directories a container rootfs is expected to have.
func layerTar(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, d := range []string{"dev/", "etc/", "proc/", "sys/", "tmp/"} {
		dirs[d] = true
	}
	for _, f := range files {
		p := strings.TrimPrefix(f.Path, "/")
		if p == "" || strings.HasSuffix(p, "/") {
			return nil, fmt.Errorf("ocilayout: bad file path %q", f.Path)
		}
		for i := strings.Index(p, "/"); i >= 0; i = nextSlash(p, i) {
			dirs[p[:i+1]] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		name := strings.TrimPrefix(f.Path, "/")
		if f.Link != "" {
			if err := tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777, ModTime: epoch,
			}); err != nil {
				return nil, err
			}
			continue
		}
		if err := writeFile(tw, name, f.Mode, f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func nextSlash(p string, i int) int {
	j := strings.Index(p[i+1:], "/")
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

func writeDir(tw *tar.Writer, name string) error {
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch})
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)),
		ModTime: epoch,
	}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// tagOf returns the tag of a reference ("e2e" for docker.io/pleg/pause:e2e),
// or "latest" when it has none.
func tagOf(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return "latest"
}
