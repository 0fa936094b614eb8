package sim

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageService is the simulator's runtime.v1.ImageService, read-only: the
// images of its containers (their IDs and digests derived from their
// names), and one image file system. PullImage and RemoveImage answer
// Unimplemented. Calls are counted as the runtime service's are.
type imageService struct {
	runtimeapi.UnimplementedImageServiceServer
	r *Runtime
}

// imageItem is an image as ListImages and ImageStatus give it.
func imageItem(name string) *runtimeapi.Image {
	return &runtimeapi.Image{Id: imageID(name), RepoTags: []string{name}, RepoDigests: []string{imageDigestRef(name)},
		Size: uint64(len(name)) << 20, Spec: &runtimeapi.ImageSpec{Image: name}}
}

// imagesLocked returns the names of the images in use, sorted.
func (r *Runtime) imagesLocked() []string {
	seen := map[string]bool{}
	for _, c := range r.containers {
		seen[c.image] = true
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (s *imageService) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	r := s.r
	if err := r.begin(ctx, "ListImages"); err != nil {
		return nil, err
	}
	defer r.end()
	r.mu.Lock()
	names := r.imagesLocked()
	r.mu.Unlock()
	resp := &runtimeapi.ListImagesResponse{}
	for _, n := range names {
		if f := req.GetFilter().GetImage().GetImage(); f != "" && f != n && f != imageID(n) {
			continue
		}
		resp.Images = append(resp.Images, imageItem(n))
	}
	return resp, nil
}

func (s *imageService) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	r := s.r
	if err := r.begin(ctx, "ImageStatus"); err != nil {
		return nil, err
	}
	defer r.end()
	want := req.GetImage().GetImage()
	if want == "" {
		return nil, status.Error(codes.InvalidArgument, "sim: image is required")
	}
	r.mu.Lock()
	names := r.imagesLocked()
	r.mu.Unlock()
	for _, n := range names {
		if want == n || want == imageID(n) {
			return &runtimeapi.ImageStatusResponse{Image: imageItem(n)}, nil
		}
	}
	// CRI: an image that is not present is a nil image, not an error.
	return &runtimeapi.ImageStatusResponse{}, nil
}

func (s *imageService) ImageFsInfo(ctx context.Context, _ *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	r := s.r
	if err := r.begin(ctx, "ImageFsInfo"); err != nil {
		return nil, err
	}
	defer r.end()
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{{
		Timestamp:  r.now(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/sim/images"},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 1 << 30},
		InodesUsed: &runtimeapi.UInt64Value{Value: 1000},
	}}}, nil
}
