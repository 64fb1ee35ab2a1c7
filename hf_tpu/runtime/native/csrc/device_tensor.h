// A tpu tensor over a storage whose data pointer is a fake address: the key under which the Python
// storage registry keeps the storage's payload (a JAX array). Shared by the device's tensor factory
// (tpu_native.cpp) and the recorder's outputs and hand-over (recorder.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>
#include <c10/util/strides.h>

namespace hf_tpu_native {

// `nbytes` of fake device memory at `fake_ptr`, never allocated on the host.
inline c10::Storage fake_storage(uint64_t fake_ptr, int64_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t{}, nbytes,
                      c10::DataPtr(reinterpret_cast<void*>(fake_ptr), c10::Device(c10::DeviceType::PrivateUse1, 0)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

// A weak reference to `storage` for Python to tell when it dies (released by the registry).
inline void* weak_reference(const c10::Storage& storage) {
  return c10::raw::intrusive_ptr::make_weak(storage.unsafeGetStorageImpl());
}

// A PrivateUse1 tensor over `storage` seen with these sizes, strides and offset.
inline at::Tensor device_tensor(c10::Storage storage, at::ScalarType dtype, c10::IntArrayRef sizes,
                                c10::IntArrayRef strides, int64_t offset = 0) {
  at::Tensor t = at::detail::make_tensor<at::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

}  // namespace hf_tpu_native
