"""Arrays on other devices get a clear error, checked without a GPU: a minimal DLPack producer
(built with ctypes) claims its host memory lives on a CUDA or ROCm device."""

import ctypes

import numpy as np
import pytest

import moe_engine

KDL_CUDA, KDL_ROCM = 2, 10


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]
# The producer below owns its memory for as long as it lives; the consumer frees nothing.
NO_OP_DELETER = DELETER(lambda _: None)

capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype = ctypes.py_object
capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DeviceArray:
    """A float32 [rows, cols] array that says it lives on `device_type`."""

    def __init__(self, device_type, rows=2, cols=4):
        self.host = np.zeros((rows, cols), np.float32)  # stands in for device memory
        self.shape = (ctypes.c_int64 * 2)(rows, cols)
        self.managed = DLManagedTensor()
        tensor = self.managed.dl_tensor
        tensor.data = self.host.ctypes.data
        tensor.device_type, tensor.device_id, tensor.ndim = device_type, 0, 2
        tensor.code, tensor.bits, tensor.lanes = 2, 32, 1  # float32
        tensor.shape = self.shape
        self.managed.deleter = NO_OP_DELETER
        self.device_type = device_type

    def __dlpack__(self, **kwargs):
        return capsule_new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_host_memory_claiming_cuda_is_refused():
    # Without the CUDA backend the build says so; with it, the driver is asked where the memory
    # is (host memory, or no GPU at all), before anything runs.
    if moe_engine.cuda_available():
        expected = r"^hidden_states: (DLPack says it is on cuda:0, but its memory is not GPU " \
                   r"memory|a CUDA array, but the CUDA runtime cannot tell where its memory is)"
    else:
        expected = r"^hidden_states: a CUDA tensor, but this build of moe_engine has no CUDA " \
                   r"backend"
    with pytest.raises(moe_engine.MoeError, match=expected):
        moe_engine.route(DeviceArray(KDL_CUDA), np.zeros((3, 4), np.float32), top_k=1)


def test_other_devices_are_refused():
    with pytest.raises(moe_engine.MoeError, match=r"^router_weight: expected a CPU or CUDA array; "
                                                  r"got one on DLPack device type 10"):
        moe_engine.route(np.zeros((2, 4), np.float32), DeviceArray(KDL_ROCM), top_k=1)


def test_the_producer_is_read_on_the_cpu():
    # The same producer claiming the CPU is read like any array: the test above fails on the
    # device, not on the producer.
    ids, weights = moe_engine.route(DeviceArray(1), np.zeros((3, 4), np.float32), top_k=1)
    np.testing.assert_array_equal(ids, [[0], [0]])
