"""The models normgrad.bench_torch times: torchvision's, converted for each
configuration (torch, normgrad with fusion, InPlaceABN, checkpointed,
compiled), with LeakyReLU in place of ReLU where asked, and the same model
without batch norm and activations, against which their share of a step is
measured."""
import torch

import normgrad.torch as ngt


def with_leaky_relu(model, slope=0.01, inplace=False):
    """Every nn.ReLU of `model` replaced by nn.LeakyReLU(slope), in place only
    where the ReLU was and `inplace` says to keep that."""
    for name, child in list(model.named_children()):
        if type(child) is torch.nn.ReLU:
            setattr(model, name, torch.nn.LeakyReLU(slope, inplace=inplace and child.inplace))
        else:
            with_leaky_relu(child, slope, inplace)
    return model


def without_bn_and_activations(model):
    """`model` with every batch norm and ReLU/LeakyReLU an nn.Identity: the
    step's time without them, against which their share is measured."""
    for name, child in list(model.named_children()):
        if isinstance(child, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.ReLU,
                              torch.nn.LeakyReLU)):
            setattr(model, name, torch.nn.Identity())
        else:
            without_bn_and_activations(child)
    return model


def make_model(name, config, leaky_inplace=False):
    """torchvision's `name` (random init, seed 0) for a configuration: torch,
    normgrad (convert with fusion) or normgrad-abn (convert with InPlaceABN);
    leaky-* configurations have LeakyReLU(0.01) for every ReLU."""
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)()
    if config.startswith("leaky-"):
        model = with_leaky_relu(model, inplace=leaky_inplace)
        config = config[len("leaky-"):]
    if config == "no-bn":
        return without_bn_and_activations(model)
    if config == "normgrad":
        return ngt.convert(model, fuse=True)
    if config == "normgrad-abn":
        return ngt.convert(model, inplace_abn=True)
    if config == "normgrad-ckpt":
        return ngt.convert(model, fuse=True, checkpoint="blocks")
    if config == "normgrad-abn-ckpt":
        return ngt.convert(model, inplace_abn=True, checkpoint="blocks")
    if config == "normgrad-compile":
        return ngt.compile(model)
    return model
